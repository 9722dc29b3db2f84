"""Projection benchmark: one pass over a model's projections and LM head, eager (MKL) vs the fast path,
and the int8 self-draft's projections beside them.

The engine's `Projection` objects, built both ways from random weights of the model's shapes
(every layer's fused qkv, o, fused gate/up and down, then the LM head: the weights one decode or
verify step streams), multiply M rows; the int8 self-draft's `Int8Projection`s of the same weights
do too, once per int8 kernel this CPU runs (`vnni`: activations rounded to int8 in groups of 16 and
multiplied in integers; `avx512`, `avx2`: int8 weights widened in registers, fp32 activations). All
variants alternate for `rounds` rounds; the median ms per pass is reported, with the weight-streaming
rate it implies and each int8 pass's cost as a share of the fp32 fast path's. Ends with one JSON line.

What bounds the fp32 pass: before timing, `small_gemm.fma_peak_gflops` measures the FMA rate the CPU gives the
bench's threads (8-wide FMAs in registers: the AVX2 tiles' ceiling; AVX-512 tiles may pass it where the CPU
runs 512-bit FMAs at full width). Each M's `floor_ms` is the larger of the pass's FLOPs (2 M per weight) at
that rate and the one-row pass (streaming the weights; when M = 1 is among the rows); `fast_over_floor` is how
far the pass is above it, `fast_gflops` the rate it ran at.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import ClassVar

import torch
from rich.table import Table

from specrl.bench import Bench
from specrl.kernels.small_gemm import fma_peak_gflops
from specrl.models.checkpoint import load_config
from specrl.models.llama import Int8Projection, Projection, fast_path_available, int8_kernels, kernels_report
from specrl.models.registry import resolve_checkpoint
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class KernelBenchConfig:
    SECTION: ClassVar[str] = "bench kernel"

    model: str = "smollm2-135m"  # whose shapes (a registered name or a checkpoint folder)
    rows: tuple[int, ...] = (1, 2, 3, 4, 8, 16, 32, 64, 128)  # M values
    rounds: int = within(7, "[1, inf)")  # timed rounds; medians are reported
    threads: int | None = within(None, "[1, inf)")  # torch CPU threads; None = all cores

    def __post_init__(self):
        check_fields(self)
        if not self.rows or min(self.rows) < 1:
            raise ValueError("bench kernel: rows must be positive integers")


def model_shapes(model: str) -> list[tuple[int, int]]:
    """(out, in) of every projection one step streams: per layer qkv, o, gate/up, down; then the LM head."""
    c = load_config(resolve_checkpoint(model))
    H, d, I = c.hidden_size, c.head_dim, c.intermediate_size
    layer = [((c.num_attention_heads + 2 * c.num_key_value_heads) * d, H), (H, c.num_attention_heads * d),
             (2 * I, H), (H, I)]
    return layer * c.num_hidden_layers + [(c.output_vocab_size, H)]


@torch.inference_mode()
def run_kernel_bench(config: KernelBenchConfig, progress=None) -> dict:
    if not fast_path_available(True):
        raise ValueError("the fast path's kernel is unavailable here (see the warning above)")
    shapes = model_shapes(config.model)
    weights = [torch.randn(out, inp) / inp ** 0.5 for out, inp in shapes]
    fast = [Projection(w, fast=True) for w in weights]
    variants = {"eager": [Projection(w) for w in weights], "fast": fast,
                **{f"int8_{kernel}": [Int8Projection(p, kernel) for p in fast] for kernel in int8_kernels()}}
    megabytes = sum(w.numel() for w in weights) * 4 / 1e6
    peak = fma_peak_gflops()
    rows = []
    for i, m in enumerate(config.rows):
        inputs = {inp: torch.randn(m, inp) for _, inp in set(shapes)}
        times = {name: [] for name in variants}
        for r in range(config.rounds + 1):
            for name, projections in variants.items():
                start = time.perf_counter()
                for p, (_, inp) in zip(projections, shapes):
                    p(inputs[inp])
                if r:  # the first round warms up
                    times[name].append(time.perf_counter() - start)
        ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
        rows.append({"rows": m, "eager_ms": ms["eager"], "fast_ms": ms["fast"], "speedup": ms["eager"] / ms["fast"],
                     "fast_gb_per_s": megabytes / ms["fast"],
                     **{f"{name}_ms": ms[name] for name in variants if name.startswith("int8")},
                     **{f"{name}_vs_fast": ms[name] / ms["fast"] for name in variants if name.startswith("int8")}})
        if progress is not None:
            progress(i + 1, len(config.rows))
    one = rows[0]["fast_ms"] if config.rows[0] == 1 else None
    for row in rows:
        row["fast_gflops"] = 2 * row["rows"] * megabytes / 4 / row["fast_ms"]  # megabytes / 4: million weights
        row["floor_ms"] = max(row["fast_gflops"] * row["fast_ms"] / peak, one or 0.0)
        row["fast_over_floor"] = row["fast_ms"] / row["floor_ms"]
    return {"model": config.model, "threads": torch.get_num_threads(), **kernels_report(), "weights_mb": megabytes,
            "rounds": config.rounds, "fma_peak_gflops": peak,
            "int8_kernels": [name for name in variants if name.startswith("int8")],
            "rows": rows, "fast_cost_vs_one_row": {str(r["rows"]): r["fast_ms"] / one for r in rows} if one else None}


def report(summary: dict, config: KernelBenchConfig, console) -> None:
    """Per row count: ms per pass eager and on the fast path, its weight-streaming rate, each int8 kernel's ms."""
    table = Table(title=f"projections of {config.model} ({summary['weights_mb']:.0f} MB), {summary['threads']} threads, "
                        f"FMA peak {summary['fma_peak_gflops']:.0f} GFLOP/s")
    int8 = summary["int8_kernels"]
    for column in ("rows M", "eager ms", "fast ms", "speedup", "fast GB/s", "fast GFLOP/s", "fast / floor",
                   *(f"{name} ms (/ fast)" for name in int8)):
        table.add_column(column)
    for row in summary["rows"]:
        table.add_row(str(row["rows"]), f"{row['eager_ms']:.1f}", f"{row['fast_ms']:.1f}", f"{row['speedup']:.2f}x",
                      f"{row['fast_gb_per_s']:.1f}", f"{row['fast_gflops']:.1f}", f"{row['fast_over_floor']:.2f}",
                      *(f"{row[name + '_ms']:.1f} ({row[name + '_vs_fast']:.2f})" for name in int8))
    console.print(table)


BENCH = Bench(KernelBenchConfig, run_kernel_bench, report, steps=lambda c: len(c.rows),
              help="one pass over a model's projections: eager (MKL) vs the fast path, and the int8 self-draft's "
                   "kernels, per row count",
              description="Times the engine's projections and LM head at the model's shapes (random weights) for "
                          "each row count M, eager and on the fast path (specrl's small-row kernel), and with the "
                          "weights rounded to int8 on each int8 kernel this CPU runs (the self-draft's), "
                          "alternating; prints median ms per pass, the weight-streaming rate and each int8 pass as "
                          "a share of the fp32 fast path's.")
