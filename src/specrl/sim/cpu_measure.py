"""Measure this CPU (1 thread, fp32) and write `cpu_calibration.json`.

    python -m specrl.sim.cpu_measure            # ~50 s; rewrites src/specrl/sim/cpu_calibration.json

What it times (best of a few runs, torch.set_num_threads(1), random weights):
  - peak: a 1024^3 fp32 matmul;  bandwidth: summing a 256 MB tensor;
  - "overhead" points: 1-, 2- and 6-layer Llamas of width 64 (their roofline is negligible,
    so their time is the per-forward and per-layer dispatch cost);
  - "fit" points: 6- and 12-layer Llamas of SmolLM2's shape (225-310 MB of weights, past the
    caches) at 1..256 new tokens per forward (batch x tokens per sequence) over a 32-token KV cache;
  - "holdout" points (never fitted): the full 30-layer SmolLM2-135M shape and specrl's `tiny`.
`specrl.sim.fit.fit_cpu_efficiency` turns the fit points into the efficiency constants.
"""
from __future__ import annotations

import json
import platform
import time

from specrl.sim.fit import fit_cpu_efficiency
from specrl.sim.hardware import CPU_CALIBRATION_PATH
from specrl.sim.models import get_model

SMOL = {"hidden": 576, "heads": 9, "kv_heads": 3, "head_dim": 64, "ffn": 1536, "vocab": 49152}
SMALL = {"hidden": 64, "heads": 2, "kv_heads": 1, "head_dim": 32, "ffn": 128, "vocab": 32}
FIT_POINTS = [(1, 1), (1, 2), (1, 4), (8, 1), (4, 4), (16, 1), (32, 1), (8, 4), (64, 1), (32, 4), (64, 4)]
HOLDOUT = {"smollm2-135m": [(1, 1), (1, 5), (8, 1), (8, 5)], "tiny": [(1, 1), (1, 4), (16, 1), (16, 4), (64, 4)]}
CTX = 32


def _llama(cfg: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        head_dim=cfg["head_dim"], tie_word_embeddings=True, max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


def time_forward(model, batch: int, q: int, ctx: int = CTX, reps: int = 4) -> float:
    """Best-of-`reps` seconds for one forward of [batch, q] new tokens over a ctx-token KV cache."""
    import torch
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(torch.randint(0, vocab, (batch, ctx)), past_key_values=cache, use_cache=True)
        x = torch.randint(0, vocab, (batch, q))
        best = float("inf")
        for i in range(reps + 1):
            t0 = time.perf_counter()
            model(x, past_key_values=cache, use_cache=True)
            dt = time.perf_counter() - t0
            cache.crop(-q)
            if i:
                best = min(best, dt)
    return best


def measure_peak_and_bandwidth() -> tuple[float, float]:
    """(FLOP/s of a 1024^3 fp32 matmul, bytes/s summing a 256 MB tensor), best of 3."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    big = torch.ones(64 * 1024 * 1024)
    flops, bw = 0.0, 0.0
    for _ in range(3):
        t0 = time.perf_counter(); torch.mm(a, b); dt = time.perf_counter() - t0
        flops = max(flops, 2 * 1024**3 / dt)
        t0 = time.perf_counter(); big.sum(); dt = time.perf_counter() - t0
        bw = max(bw, big.numel() * 4 / dt)
    return flops, bw


def _shape_of(name: str) -> dict:
    m = get_model(name)
    return {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
            "head_dim": m.head_dim, "ffn": m.ffn, "vocab": m.vocab}


def measure() -> dict:
    """Run every measurement and return the JSON-ready calibration record."""
    import torch

    torch.set_num_threads(1)
    peak, bw = measure_peak_and_bandwidth()
    records = []
    for layers in (1, 2, 6):
        cfg = {**SMALL, "layers": layers}
        records.append({"role": "overhead", "config": cfg, "batch": 1, "q": 1, "ctx": CTX,
                        "seconds": time_forward(_llama(cfg), 1, 1)})
    for layers in (6, 12):
        cfg = {**SMOL, "layers": layers}
        model = _llama(cfg)
        for batch, q in FIT_POINTS:
            records.append({"role": "fit", "config": cfg, "batch": batch, "q": q, "ctx": CTX,
                            "seconds": time_forward(model, batch, q)})
    holdout = []
    for name, points in HOLDOUT.items():
        model = _llama(_shape_of(name))
        for batch, q in points:
            holdout.append({"model": name, "batch": batch, "q": q, "ctx": CTX,
                            "seconds": time_forward(model, batch, q, reps=3)})
    efficiency = fit_cpu_efficiency(records, peak, bw)
    return {
        "command": "python -m specrl.sim.cpu_measure",
        "machine": platform.processor() or platform.machine(),
        "torch_threads": 1,
        "device": {"peak_flops": peak, "mem_bw": bw, "mem_bytes": 8e9},
        "efficiency": efficiency,
        "records": records,
        "holdout": holdout,
    }


def main() -> None:
    t0 = time.perf_counter()
    data = measure()
    CPU_CALIBRATION_PATH.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {CPU_CALIBRATION_PATH} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
