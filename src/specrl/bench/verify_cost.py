"""What verifying K drafts costs against a plain decode step, by batch, measured next to the simulator's figure.

    specrl bench verify-cost [--device cuda] [--models smollm2-135m,llama-3.2-1b,llama-3.1-8b]
                             [--batches 1,4,16,64,256] [--ks 0,1,3,7] [--context 512] [--rounds 10]

For each model of the simulator's catalogue (`specrl.sim.models`; dense Llama-shaped ones), it builds a decoder
of that shape with random weights (bf16 on a GPU, fp32 on the CPU; `Decoder`), with a KV cache of `--context`
tokens per row, and times one forward of B rows x (K + 1) new tokens against it: the target's verify pass
(K = 0 is a plain decode step). On a GPU each shape is captured as a CUDA graph and timed by its replays with
CUDA events, as a serving engine runs decode steps: an eager forward there measures kernel launches, not the
hardware. Median of `--rounds`. Next to each figure it prints the simulator's `Engine.target_time` for the
same shape on the matching device (h100 / h200 / cpu), and each pass's ratio to the plain step. Ends with one
JSON line.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from rich.table import Table

from specrl.bench import Bench
from specrl.sim.hardware import get_device
from specrl.sim.iteration import Engine
from specrl.sim.models import ModelSpec, get_model
from specrl.validation import check_fields, within


def dense_spec(name: str) -> ModelSpec:
    """A model of the simulator's catalogue that a dense Llama can stand for (no MoE, no MLA), by name."""
    spec = get_model(name)
    if spec.is_moe or spec.attn_params_override is not None:
        raise ValueError(f"{name}: only dense Llama-shaped models can be built here")
    return spec


class Decoder:
    """A dense Llama-shaped decoder of `spec`'s shape with random weights, reduced to what costs time: per layer
    the fused qkv, o, gate-up and down projections, SDPA over a preallocated KV cache (GQA), RMS norms and the
    SwiGLU; then the LM head. RoPE is left out (elementwise, a few microseconds)."""

    def __init__(self, name: str, device: torch.device, dtype: torch.dtype):
        spec = self.spec = dense_spec(name)
        g = torch.Generator(device).manual_seed(0)

        def weight(*shape):
            return (torch.randn(*shape, generator=g, device=device) * 0.02).to(dtype)

        H, KV, D, E = spec.heads, spec.kv_heads, spec.head_dim, spec.hidden
        self.embed = weight(spec.vocab, E)
        self.layers = [{"qkv": weight((H + 2 * KV) * D, E), "o": weight(E, H * D),
                        "gate_up": weight(2 * spec.ffn, E), "down": weight(E, spec.ffn)} for _ in range(spec.layers)]
        self.lm_head = self.embed if spec.tied else weight(spec.vocab, E)
        self.device, self.dtype = device, dtype

    def cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.spec
        return [(torch.randn(batch, s.kv_heads, length, s.head_dim, device=self.device).to(self.dtype),
                 torch.randn(batch, s.kv_heads, length, s.head_dim, device=self.device).to(self.dtype))
                for _ in self.layers]

    def forward(self, ids: torch.Tensor, cache, context: int) -> torch.Tensor:
        """Logits of ids [B, T] after `context` cached tokens. Each new token attends to all context + T keys: the
        causal mask among the T new ones is left out, since it changes what is computed over T of ~context keys,
        not the cost, and an explicit mask keeps SDPA off its flash kernel, onto a slower one."""
        s, (B, T) = self.spec, ids.shape
        H, KV, D = s.heads, s.kv_heads, s.head_dim
        norm = torch.nn.functional.rms_norm
        h = self.embed[ids]
        for w, (k_cache, v_cache) in zip(self.layers, cache):
            q, k, v = (norm(h, (s.hidden,)) @ w["qkv"].T).split([H * D, KV * D, KV * D], dim=-1)
            k_cache[:, :, context:context + T] = k.view(B, T, KV, D).transpose(1, 2)
            v_cache[:, :, context:context + T] = v.view(B, T, KV, D).transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.view(B, T, H, D).transpose(1, 2), k_cache[:, :, :context + T], v_cache[:, :, :context + T],
                enable_gqa=True)
            h = h + out.transpose(1, 2).reshape(B, T, H * D) @ w["o"].T
            gate, up = (norm(h, (s.hidden,)) @ w["gate_up"].T).chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ w["down"].T
        return norm(h, (s.hidden,)) @ self.lm_head.T


def sim_device_name(device: torch.device) -> str:
    """The simulator's name for a torch device (`sim.hardware`): cpu, or the GPU model."""
    if device.type == "cpu":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    for known in ("h200", "h100", "b200", "gb200"):
        if known in name.lower():
            return known
    raise ValueError(f"no simulator device matches {name!r}")


class Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        """Milliseconds of one call of fn."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def timed_pass(model: Decoder, batch: int, k: int, context: int):
    """A function that runs one verify pass of this shape: a CUDA graph's replay on a GPU (how serving engines
    run decode steps: no launch gaps), the eager forward on the CPU."""
    cache = model.cache(batch, context + k + 1)
    ids = torch.randint(0, model.spec.vocab, (batch, k + 1), device=model.device)
    def run():
        model.forward(ids, cache, context)

    if model.device.type != "cuda":
        return run
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


@torch.no_grad()
def measure(name: str, device: torch.device, dtype: torch.dtype, batches: list[int], ks: list[int], context: int,
            rounds: int) -> list[dict]:
    model, timer = Decoder(name, device, dtype), Timer(device)
    engine = Engine(get_device(sim_device_name(device)), model.spec)
    rows = []
    for batch in batches:
        for k in ks:
            run = timed_pass(model, batch, k, context)
            for _ in range(3):
                run()
            ms = statistics.median(timer(run) for _ in range(rounds))
            sim_ms = float(engine.target_time(batch, k, batch * context)) * 1e3
            rows.append({"model": name, "batch": batch, "k": k, "ms": ms, "sim_ms": sim_ms})
            del run
            if device.type == "cuda":
                torch.cuda.empty_cache()
    plain = {r["batch"]: r for r in rows if r["k"] == 0}
    for r in rows:
        r["over_plain"] = r["ms"] / plain[r["batch"]]["ms"]
        r["sim_over_plain"] = r["sim_ms"] / plain[r["batch"]]["sim_ms"]
    return rows


@dataclass(frozen=True)
class VerifyCostBenchConfig:
    """Which models, batches and draft counts to time, and where."""

    SECTION: ClassVar[str] = "bench verify-cost"

    device: Literal["cpu", "cuda"] = "cpu"  # cuda: bf16, each shape a CUDA graph; cpu: fp32
    models: tuple[str, ...] = ("smollm2-135m", "llama-3.2-1b", "llama-3.1-8b")  # of the simulator's catalogue
    batches: tuple[int, ...] = (1, 4, 16, 64, 256)  # rows (sequences) per pass
    ks: tuple[int, ...] = (0, 1, 3, 7)  # drafts verified per row (0 = a plain decode step, always timed)
    context: int = within(512, "[1, inf)")  # cached tokens per row
    rounds: int = within(10, "[1, inf)")  # timed passes per shape; medians are reported
    threads: int | None = within(2, "[1, inf)")  # torch CPU threads

    def __post_init__(self):
        check_fields(self)
        if not self.models or not self.batches or min(self.batches) < 1 or not self.ks or min(self.ks) < 0:
            raise ValueError("bench verify-cost: models, batches (>= 1) and ks (>= 0) must be non-empty")


def run_verify_cost_bench(config: VerifyCostBenchConfig, progress=None) -> dict:
    """Every model's rows: ms per pass, the simulator's ms, each as a ratio to the plain step."""
    device = torch.device(config.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ks = sorted({0, *config.ks})
    rows = []
    for i, name in enumerate(config.models):
        rows += measure(name, device, dtype, list(config.batches), ks, config.context, config.rounds)
        if progress is not None:
            progress(i + 1)
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"bench": "verify_cost", "device": label, "dtype": str(dtype), "context": config.context,
            "rounds": config.rounds, "threads": torch.get_num_threads(), "rows": rows}


def report(summary: dict, config: VerifyCostBenchConfig, console) -> None:
    table = Table(title=f"verify pass against a plain decode step: {summary['device']}, {summary['dtype']}, "
                        f"context {config.context}, median of {config.rounds}")
    for column in ("model", "B", "K", "ms", "x plain", "sim ms", "sim x plain"):
        table.add_column(column)
    for r in summary["rows"]:
        table.add_row(r["model"], str(r["batch"]), str(r["k"]), f"{r['ms']:.3f}", f"{r['over_plain']:.2f}",
                      f"{r['sim_ms']:.3f}", f"{r['sim_over_plain']:.2f}")
    console.print(table)


BENCH = Bench(VerifyCostBenchConfig, run_verify_cost_bench, report, steps=lambda c: len(c.models),
              help="what verifying K drafts costs against a plain decode step, by batch, next to the simulator's",
              description=__doc__.split("\n\n", 1)[1].split("Ends with")[0].strip())
