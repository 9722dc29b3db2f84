"""One forward pass of the engine's network, each layer in one kernel call against the PyTorch layer.

    python -m specrl.bench.forward_pass [--model smollm2-135m] [--shapes 1x1,1x9,4x1,4x9] [--context 200]
                                        [--rounds 7] [--threads 1]

For each B x T (rows x new tokens per row, after `--context` cached tokens) it times `LlamaModel.forward`
of the fp32 policy and of its int8 copy (the self-draft) with the fused layer (`kernels/decoder_layer`) and
with the PyTorch layer, alternating the variants in each round, and the projections alone (the four per
layer and the LM head, on the same kernels) to show what is left around them. Prints median ms per pass and
ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specrl.models.llama import LlamaModel
from specrl.models.registry import resolve_checkpoint


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--shapes", default="1x1,1x9,4x1,4x9", help="comma-separated BxT (rows x new tokens)")
    parser.add_argument("--context", type=int, default=200, help="cached tokens per row before the pass")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = LlamaModel.from_pretrained(resolve_checkpoint(args.model))
    networks = {"fp32": policy, "int8": policy.int8_copy()}
    if policy.fused_layers is None:
        raise SystemExit("the fused layer cannot run here (no fast-path kernel): nothing to compare")
    results = []
    for shape in args.shapes.split(","):
        batch, new = (int(v) for v in shape.split("x"))
        variants = {f"{name}_{kind}": forward(net, batch, new, args.context, kind == "fused")
                    for name, net in networks.items() for kind in ("fused", "pytorch")}
        variants.update({f"{name}_projections": projections_only(net, batch * new) for name, net in networks.items()})
        times = {name: [] for name in variants}
        for run in variants.values():
            run()  # warm up
        for _ in range(args.rounds):
            for name, run in variants.items():
                start = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - start) * 1e3)
        row = {"rows": batch, "tokens": new, **{f"{name}_ms": statistics.median(t) for name, t in times.items()}}
        results.append(row)
        print(f"{batch} x {new}: " + "  ".join(f"{name} {row[name + '_ms']:.1f}" for name in variants))
    print(json.dumps({"model": args.model, "threads": args.threads, "context": args.context, "rounds": args.rounds,
                      "shapes": results}))


if __name__ == "__main__":
    main()
