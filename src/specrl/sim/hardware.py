"""Hardware catalogue: what one device can do, and how much of it an engine gets.

A `Device` holds datasheet numbers (peak FLOP/s, memory bandwidth, links).
An `Efficiency` holds the few calibrated constants that turn datasheet numbers
into engine step times: the matmul-efficiency curve mfu(n), the fraction of
bandwidth achieved (mbu), and fixed per-iteration / per-forward overheads.

One `Efficiency` is shared by every GPU: it was fitted once, on published H100
measurements (`specrl.sim.fit.fit_gpu_efficiency`, guarded by a test), and is
reused unchanged for H200, B200 and GB200. The CPU's efficiency is fitted from a
short measurement on this machine and read from `cpu_calibration.json`
(regenerate with `python -m specrl.sim.cpu_measure`).

Units: FLOP/s, bytes/s, bytes, seconds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

CPU_CALIBRATION_PATH = Path(__file__).with_name("cpu_calibration.json")


@dataclass(frozen=True)
class Efficiency:
    """Calibrated efficiencies of one engine on one device class.

    mfu_max: fraction of peak FLOP/s that large matmuls reach.
    n_half: tokens per step at which matmul efficiency is half of mfu_max
        (the smooth curve mfu(n) = mfu_max * n / (n + n_half)).
    mfu_table: optional measured curve ((n, mfu), ...) replacing the smooth one;
        interpolated in log n, clamped at both ends (used for the CPU, whose BLAS
        switches kernels at a few row counts).
    mbu: fraction of memory bandwidth achieved streaming weights and KV.
    step_overhead_s: fixed time per engine iteration outside model forwards
        (scheduling, sampling, host work).
    forward_overhead_s: fixed time per model forward (launches, graph replay).
    layer_overhead_s: extra fixed time per decoder layer per forward (host-side
        dispatch; ~0 on GPUs with CUDA graphs, large in eager PyTorch on a CPU).
    collective_latency_s: latency of one small all-reduce / all-to-all.
    collective_efficiency: achieved bus bandwidth / link bandwidth.
    """

    mfu_max: float
    n_half: float
    mbu: float
    step_overhead_s: float
    forward_overhead_s: float
    layer_overhead_s: float = 0.0
    collective_latency_s: float = 8e-6
    collective_efficiency: float = 0.52
    mfu_table: tuple[tuple[float, float], ...] | None = None

    def mfu(self, n_tokens):
        """Matmul FLOP efficiency for GEMMs with `n_tokens` rows (array-friendly)."""
        n = np.maximum(np.asarray(n_tokens, dtype=float), 1.0)
        if self.mfu_table:
            xs = np.log([p[0] for p in self.mfu_table])
            ys = [p[1] for p in self.mfu_table]
            return np.interp(np.log(n), xs, ys)
        return self.mfu_max * n / (n + self.n_half)


@dataclass(frozen=True)
class Device:
    """Datasheet numbers of one accelerator (or CPU socket share).

    peak_flops: dense matmul FLOP/s at the serving dtype (bf16 on GPUs, fp32 on the CPU).
    mem_bw: memory bandwidth, bytes/s.
    mem_bytes: device memory, bytes.
    link_bw: scale-up link bandwidth per device (NVLink), bytes/s.
    net_bw: scale-out network bandwidth per device, bytes/s (weight broadcast across nodes).
    bytes_per_param: 2 for bf16, 4 for fp32.
    efficiency: the calibrated constants above.
    """

    name: str
    peak_flops: float
    mem_bw: float
    mem_bytes: float
    link_bw: float
    net_bw: float
    bytes_per_param: float
    efficiency: Efficiency = field(repr=False)


# Fitted once by `specrl.sim.fit.fit_gpu_efficiency()` on the published H100
# step models (vLLM Llama-3.1-8B target and EAGLE draft); a test checks these
# literals still equal that fit. Shared by all GPUs below.
GPU_EFFICIENCY = Efficiency(
    mfu_max=0.515,
    n_half=201.0,
    mbu=0.746,
    step_overhead_s=1.16e-3,
    forward_overhead_s=0.05e-3,
    collective_latency_s=8e-6,  # assumption: small-message NVLink all-reduce (custom AR / NCCL LL)
    collective_efficiency=0.52,  # 470 GB/s measured 8-GPU all-reduce bus bandwidth / 900 GB/s NVLink
)

_TB = 1e12
_GB = 1e9

GPUS = {
    "h100": Device("h100", 989e12, 3.35 * _TB, 80 * _GB, 900 * _GB, 50 * _GB, 2, GPU_EFFICIENCY),
    "h200": Device("h200", 989e12, 4.8 * _TB, 141 * _GB, 900 * _GB, 50 * _GB, 2, GPU_EFFICIENCY),
    "b200": Device("b200", 2250e12, 8.0 * _TB, 180 * _GB, 1800 * _GB, 50 * _GB, 2, GPU_EFFICIENCY),
    "gb200": Device("gb200", 2500e12, 8.0 * _TB, 186 * _GB, 1800 * _GB, 50 * _GB, 2, GPU_EFFICIENCY),
}


def cpu_device(path: Path = CPU_CALIBRATION_PATH) -> Device:
    """This machine's CPU at one thread, fp32, from the fitted JSON file."""
    return _cpu_device_cached(str(path))


@lru_cache(maxsize=4)
def _cpu_device_cached(path: str) -> Device:
    data = json.loads(Path(path).read_text())
    eff = data["efficiency"]
    efficiency = Efficiency(
        mfu_max=max(m for _, m in eff["mfu_table"]),
        n_half=0.0,
        mbu=eff["mbu"],
        step_overhead_s=eff["step_overhead_s"],
        forward_overhead_s=eff["forward_overhead_s"],
        layer_overhead_s=eff["layer_overhead_s"],
        mfu_table=tuple((float(n), float(m)) for n, m in eff["mfu_table"]),
    )
    dev = data["device"]
    return Device("cpu", dev["peak_flops"], dev["mem_bw"], dev["mem_bytes"], 0.0, 0.0, 4, efficiency)


def get_device(name: str) -> Device:
    """Look a device up by name: h100, h200, b200, gb200 or cpu."""
    if name == "cpu":
        return cpu_device()
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown device {name!r}; known: {sorted(GPUS) + ['cpu']}") from None
