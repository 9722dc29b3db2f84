"""Fit the calibrated efficiencies, once, from step-time data.

GPU: `fit_gpu_efficiency` fits (mfu_max, n_half, mbu) so that our roofline
reproduces the published vLLM H100 Llama-3.1-8B step model over decode and
verify steps (batch 1..256, 1..4 tokens per sequence, 256..2048 cached tokens
per sequence); splits the published 1.21 ms per-step overhead into a
per-forward part (fitted on the published EAGLE draft time, three forwards per
iteration) and the rest (per iteration). The result is written as literals in
`hardware.GPU_EFFICIENCY`; a test checks they still agree.

CPU: `fit_cpu_efficiency` turns forward timings measured on this machine
(`specrl.sim.cpu_measure`) into per-layer / per-forward overheads, an effective
bandwidth, and a measured mfu table.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

from specrl.sim import published
from specrl.sim.costs import Layout, forward_cost
from specrl.sim.drafters import eagle_network
from specrl.sim.hardware import GPUS, Device, Efficiency
from specrl.sim.models import get_model


def _gpu_grid():
    """(batch, tokens per sequence, cached tokens per sequence) points the H100 fit uses."""
    for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for q in (1, 2, 4):
            for ctx in (256, 1024, 2048):
                yield batch, q, ctx


def fit_gpu_efficiency() -> Efficiency:
    """Least-squares fit of the GPU efficiencies to the published H100 vLLM step models (relative error)."""
    model = get_model("llama-3.1-8b")
    base = GPUS["h100"]
    grid = list(_gpu_grid())
    step = published.VLLM_H100_TARGET["step_overhead_s"]

    def device_with(mfu_max, n_half, mbu, fwd=0.0):
        eff = replace(base.efficiency, mfu_max=mfu_max, n_half=n_half, mbu=mbu, forward_overhead_s=fwd,
                      step_overhead_s=0.0)
        return replace(base, efficiency=eff)

    def residuals(x):
        dev = device_with(*x)
        out = []
        for b, q, ctx in grid:
            ours = float(forward_cost(dev, model, Layout(), b * q, b * ctx, q).total) + step
            out.append(ours / published.vllm_h100_target_step(b * q, b * ctx) - 1.0)
        return out

    sol = least_squares(residuals, x0=[0.7, 200.0, 0.8], bounds=([0.2, 1.0, 0.3], [1.0, 4000.0, 1.0]))
    mfu_max, n_half, mbu = sol.x

    # Per-forward overhead: published EAGLE draft time minus our roofline for its K forwards.
    dev = device_with(mfu_max, n_half, mbu)
    draft = eagle_network(model)
    k = published.VLLM_H100_EAGLE_DRAFT["k"]
    gaps = []
    for batch in (1, 2, 4, 8, 16, 32, 64, 128):
        ours = k * float(forward_cost(dev, draft, Layout(), batch, batch * 1024, 1.0).total)
        gaps.append((published.vllm_h100_eagle_draft(batch, k, batch * 1024) - ours) / k)
    fwd = float(np.clip(np.mean(gaps), 0.0, step))
    return replace(
        base.efficiency, mfu_max=round(float(mfu_max), 3), n_half=round(float(n_half), 0), mbu=round(float(mbu), 3),
        forward_overhead_s=round(fwd, 5), step_overhead_s=round(step - fwd, 5),
    )


def fit_cpu_efficiency(records: list[dict], peak_flops: float, mem_bw: float) -> dict:
    """Fit CPU efficiencies from forward timings on this machine.

    records: dicts with `config` (a ModelSpec-like dict: layers, hidden, heads, kv_heads, head_dim,
        ffn, vocab), `batch`, `q` (new tokens per sequence), `ctx` (cached tokens per sequence),
        `seconds`, and `role` ("overhead": a tiny model whose roofline is negligible, "fit").
    peak_flops, mem_bw: measured large-matmul FLOP/s and streaming bandwidth at 1 thread.

    Steps: (1) overheads from the tiny models: seconds = forward + layers * layer (least squares);
    (2) mbu from the single-token points (a GEMV is bandwidth-bound);
    (3) for each token count n, the mfu that makes max(compute, memory) match the remaining time.
    """
    from specrl.sim.models import ModelSpec

    tiny = [r for r in records if r["role"] == "overhead"]
    a = np.array([[1.0, r["config"]["layers"]] for r in tiny])
    y = np.array([r["seconds"] for r in tiny])
    (fwd, per_layer), *_ = np.linalg.lstsq(a, y, rcond=None)
    fwd, per_layer = max(float(fwd), 0.0), max(float(per_layer), 0.0)

    fit = [r for r in records if r["role"] == "fit"]
    specs = [ModelSpec("m", tied=True, **r["config"]) for r in fit]
    flat = Efficiency(mfu_max=1.0, n_half=0.0, mbu=1.0, step_overhead_s=0.0, forward_overhead_s=0.0,
                      layer_overhead_s=0.0, mfu_table=((1.0, 1.0), (2.0, 1.0)))
    dev = Device("cpu", peak_flops, mem_bw, 0.0, 0.0, 0.0, 4, flat)

    def pieces(r, spec):
        c = forward_cost(dev, spec, Layout(), r["batch"] * r["q"], r["batch"] * r["ctx"], r["q"])
        left = r["seconds"] - fwd - per_layer * spec.layers
        return float(c.compute), float(c.memory), left

    gemv = [pieces(r, s) for r, s in zip(fit, specs) if r["batch"] * r["q"] == 1]
    mbu = float(np.median([mem / left for _, mem, left in gemv]))
    table = []
    for n in sorted({r["batch"] * r["q"] for r in fit}):
        ratios = [comp / left for (r, s) in zip(fit, specs) if r["batch"] * r["q"] == n
                  for comp, _, left in [pieces(r, s)]]
        table.append((n, round(float(np.median(ratios)), 4)))
    return {
        "mbu": round(mbu, 4), "forward_overhead_s": round(fwd, 6), "layer_overhead_s": round(per_layer, 6),
        "step_overhead_s": 0.0, "mfu_table": table,
    }
