"""One forward pass of the engine's network, each layer in one kernel call against the PyTorch layer.

    specrl bench forward-pass [--model smollm2-135m] [--shapes 1x1,1x9,4x1,4x9] [--context 200]
                              [--rounds 7] [--threads 1]

For each B x T (rows x new tokens per row, after `--context` cached tokens) it times `LlamaModel.forward`
of the fp32 policy and of its int8 copy (the self-draft) with the fused layer (`kernels/decoder_layer`) and
with the PyTorch layer, alternating the variants in each round, and the projections alone (the four per
layer and the LM head, on the same kernels) to show what is left around them. Prints median ms per pass and
ends with one JSON line.
"""
from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass
from typing import ClassVar

import torch
from rich.table import Table

from specrl.bench import Bench
from specrl.models.llama import LlamaModel
from specrl.models.registry import resolve_checkpoint
from specrl.validation import check_fields, within


def projections_only(model: LlamaModel, rows: int):
    c = model.cfg
    h, inner = torch.randn(rows, c.hidden_size), torch.randn(rows, c.intermediate_size)

    def run():
        for w in model.layers:
            w["qkv"](h), w["o"](torch.randn(rows, c.num_attention_heads * c.head_dim)), w["gate_up"](h), w["down"](inner)
        model.lm_head(h)
    return run


def forward(model: LlamaModel, batch: int, new: int, context: int, fused: bool):
    cache = model.new_cache(batch, context + new)
    cache.lens[:] = context
    ids = torch.randint(0, model.cfg.vocab_size, (batch, new), generator=torch.Generator().manual_seed(0))
    layers = model.fused_layers

    def run():
        model.fused_layers = layers if fused else None
        try:
            model.forward(ids, cache)
        finally:
            model.fused_layers = layers
    return run


@dataclass(frozen=True)
class ForwardPassBenchConfig:
    """Which model and which pass shapes to time."""

    SECTION: ClassVar[str] = "bench forward-pass"

    model: str = "smollm2-135m"  # a registered model or a checkpoint folder
    shapes: tuple[str, ...] = ("1x1", "1x9", "4x1", "4x9")  # BxT: rows x new tokens per row
    context: int = within(200, "[0, inf)")  # cached tokens per row before the pass
    rounds: int = within(7, "[1, inf)")  # timed rounds; medians are reported
    threads: int | None = within(1, "[1, inf)")  # torch CPU threads

    def __post_init__(self):
        check_fields(self)
        bad = [s for s in self.shapes if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", s)]
        if bad or not self.shapes:
            raise ValueError(f"bench forward-pass: shapes are BxT with B, T >= 1 (e.g. 4x9), got {list(self.shapes)}")


def run_forward_pass_bench(config: ForwardPassBenchConfig, progress=None) -> dict:
    """Per shape, median ms of each variant, alternating within each round."""
    policy = LlamaModel.from_pretrained(resolve_checkpoint(config.model))
    networks = {"fp32": policy, "int8": policy.int8_copy()}
    if policy.fused_layers is None:
        raise ValueError("the fused layer cannot run here (no fast-path kernel): nothing to compare")
    results = []
    for i, shape in enumerate(config.shapes):
        batch, new = (int(v) for v in shape.split("x"))
        variants = {f"{name}_{kind}": forward(net, batch, new, config.context, kind == "fused")
                    for name, net in networks.items() for kind in ("fused", "pytorch")}
        variants.update({f"{name}_projections": projections_only(net, batch * new) for name, net in networks.items()})
        times: dict[str, list[float]] = {name: [] for name in variants}
        for run in variants.values():
            run()  # warm up
        for _ in range(config.rounds):
            for name, run in variants.items():
                start = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - start) * 1e3)
        results.append({"rows": batch, "tokens": new, **{f"{name}_ms": statistics.median(t) for name, t in times.items()}})
        if progress is not None:
            progress(i + 1)
    return {"bench": "forward_pass", "model": config.model, "threads": torch.get_num_threads(),
            "context": config.context, "rounds": config.rounds, "shapes": results}


def report(summary: dict, config: ForwardPassBenchConfig, console) -> None:
    names = [key[:-3] for key in summary["shapes"][0] if key.endswith("_ms")]
    table = Table(title=f"one forward pass of {config.model}, ms (median of {config.rounds}), "
                        f"{summary['threads']} threads, context {config.context}")
    for column in ("B x T", *(name.replace("_", " ") for name in names)):
        table.add_column(column)
    for row in summary["shapes"]:
        table.add_row(f"{row['rows']} x {row['tokens']}", *(f"{row[name + '_ms']:.1f}" for name in names))
    console.print(table)


BENCH = Bench(ForwardPassBenchConfig, run_forward_pass_bench, report, steps=lambda c: len(c.shapes),
              help="one forward pass, each layer in one kernel call against the PyTorch layer (fp32 and int8)",
              description=__doc__.split("\n\n", 1)[1].split("Prints median")[0].strip())
