"""Step cost model: the time of one model forward over n tokens on one replica.

    forward = max(compute, memory) + communication + fixed overhead

  compute   = dense FLOPs / (peak * mfu(tokens per GEMM))
            + expert FLOPs / (peak * mfu(tokens per expert))
            + attention FLOPs / (peak * mfu_max)
  memory    = (dense weights + touched experts + KV read) / (bandwidth * mbu)
  comm      = tensor-parallel all-reduces + expert-parallel all-to-alls
  overhead  = forward_overhead + layers * layer_overhead

Every piece is a small function below. Shared assumptions (what is ignored):
compute, memory and communication do not overlap with each other except inside
the roofline max; activations, norms and the sampler's FLOPs are ignored;
routing is uniform (no hot experts); KV is read once per sequence per forward
however many query tokens it verifies.

Shapes: `kv_tokens` may be a numpy array (one entry per iteration); every
function broadcasts over it. Units: seconds, bytes, FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrl.sim.hardware import Device
from specrl.sim.models import (
    ModelSpec, attention_flops_per_pair, dense_params, expert_params, kv_bytes_per_token,
)


@dataclass(frozen=True)
class Layout:
    """How one engine replica spreads a model over its devices.

    tp: tensor-parallel degree of attention and dense layers.
    ep: expert-parallel degree (1 = experts are tensor-parallel like everything else).
    When ep > tp, the replica has ep devices and ep/tp data-parallel attention groups
    (each group holds its own sequences' KV); experts are spread over all ep devices.
    """

    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1 or self.ep < 1:
            raise ValueError(f"Layout.tp and Layout.ep must be >= 1, got tp={self.tp}, ep={self.ep}")
        if self.ep > 1 and self.ep % self.tp:
            raise ValueError(f"Layout.ep ({self.ep}) must be a multiple of Layout.tp ({self.tp})")

    @property
    def devices(self) -> int:
        return max(self.tp, self.ep)

    @property
    def attention_groups(self) -> int:
        return self.devices // self.tp


def experts_touched(experts: int, top_k: int, tokens) -> np.ndarray:
    """Distinct experts one MoE layer reads for `tokens` tokens: E * (1 - (1 - k/E)^T).

    Counts: expected distinct experts under uniform, independent top-k routing.
    Ignores: routing skew (hot experts make the real count smaller).
    Qwen3-235B (E=128, k=8): 8, 29, 52, 82, 112, 126 at T = 1, 4, 8, 16, 32, 64.
    """
    t = np.asarray(tokens, dtype=float)
    return experts * (1.0 - (1.0 - top_k / experts) ** t)


def matmul_time(flops, rows, device: Device) -> np.ndarray:
    """Seconds for matmuls of `flops` FLOPs whose GEMMs have `rows` rows: flops / (peak * mfu(rows))."""
    return np.asarray(flops, dtype=float) / (device.peak_flops * device.efficiency.mfu(rows))


def stream_time(nbytes, device: Device) -> np.ndarray:
    """Seconds to read `nbytes` from device memory: bytes / (bandwidth * mbu)."""
    return np.asarray(nbytes, dtype=float) / (device.mem_bw * device.efficiency.mbu)


def allreduce_time(nbytes, group: int, device: Device) -> np.ndarray:
    """Ring all-reduce of `nbytes` over `group` devices: latency + 2(g-1)/g * bytes / (link * eff).

    Ignores: hierarchical / tree algorithms and overlap with compute. Zero for g = 1.
    """
    if group <= 1:
        return np.zeros_like(np.asarray(nbytes, dtype=float))
    eff = device.efficiency
    wire = 2.0 * (group - 1) / group * np.asarray(nbytes, dtype=float) / (device.link_bw * eff.collective_efficiency)
    return eff.collective_latency_s + wire


def all_to_all_time(nbytes_per_device, group: int, device: Device) -> np.ndarray:
    """All-to-all where each device sends `nbytes_per_device`: latency + (g-1)/g * bytes / (link * eff).

    Ignores: load imbalance between devices and network tiers (all-NVLink domain assumed). Zero for g = 1.
    """
    if group <= 1:
        return np.zeros_like(np.asarray(nbytes_per_device, dtype=float))
    eff = device.efficiency
    wire = (group - 1) / group * np.asarray(nbytes_per_device, dtype=float) / (device.link_bw * eff.collective_efficiency)
    return eff.collective_latency_s + wire


def forward_overhead(model: ModelSpec, device: Device) -> float:
    """Fixed seconds per forward: forward_overhead + layers * layer_overhead (launch / dispatch costs)."""
    eff = device.efficiency
    return eff.forward_overhead_s + model.layers * eff.layer_overhead_s


@dataclass(frozen=True)
class ForwardCost:
    """Breakdown of one forward, seconds per term (arrays when kv_tokens was an array)."""

    compute: np.ndarray
    memory: np.ndarray
    comm: np.ndarray
    overhead: float

    @property
    def total(self) -> np.ndarray:
        return np.maximum(self.compute, self.memory) + self.comm + self.overhead


def forward_cost(
    device: Device, model: ModelSpec, layout: Layout, n_tokens: float, kv_tokens, queries_per_seq: float = 1.0,
) -> ForwardCost:
    """Cost of one forward of `n_tokens` new tokens on one replica (the slowest device's view).

    n_tokens: new tokens across the replica's live sequences (batch * queries_per_seq).
    kv_tokens: cached tokens across those sequences (scalar or array).
    queries_per_seq: new tokens per sequence (K+1 when verifying K drafts); each attends to its
        sequence's cache, so attention pairs = queries_per_seq * kv_tokens.
    """
    bpp = device.bytes_per_param
    devices, groups, tp = layout.devices, layout.attention_groups, layout.tp
    kv = np.asarray(kv_tokens, dtype=float)
    rows = n_tokens / groups  # GEMM rows of dense layers on one device

    dense_flops = 2.0 * dense_params(model) * rows / tp
    attn_flops = attention_flops_per_pair(model) * queries_per_seq * kv / groups / tp
    compute = matmul_time(dense_flops, rows, device) + attn_flops / (device.peak_flops * device.efficiency.mfu_max)

    kv_shards = min(tp, max(model.kv_heads, 1)) if model.kv_elems_override is None else 1
    weight_bytes = dense_params(model) * bpp / tp
    kv_bytes = kv * kv_bytes_per_token(model, bpp) / groups / kv_shards
    comm = model.layers * 2 * allreduce_time(rows * model.hidden * bpp, tp, device) if tp > 1 else 0.0

    if model.is_moe:
        touched = experts_touched(model.experts, model.top_k, n_tokens)
        weight_bytes = weight_bytes + model.moe_layers * touched * expert_params(model) * bpp / devices
        expert_flops = 2.0 * n_tokens * model.top_k * expert_params(model) * model.moe_layers / devices
        rows_per_expert = n_tokens * model.top_k / model.experts
        compute = compute + matmul_time(expert_flops, rows_per_expert, device)
        if layout.ep > 1:
            dispatch = (n_tokens / devices) * model.top_k * model.hidden * bpp
            comm = comm + model.moe_layers * 2 * all_to_all_time(dispatch, layout.ep, device)

    memory = stream_time(weight_bytes + kv_bytes, device)
    return ForwardCost(
        compute=np.asarray(compute, dtype=float), memory=np.asarray(memory, dtype=float),
        comm=np.asarray(comm, dtype=float) + np.zeros_like(kv), overhead=forward_overhead(model, device),
    )
