"""Time of one engine iteration, with and without speculation.

    plain iteration  = step_overhead + target forward over B tokens
    spec iteration   = step_overhead + K draft forwards over B tokens each
                       + target forward over B*(K+1) tokens (verification)
                       + host drafting (n-gram lookups)

B is the live batch on one replica; K = 0 means speculation off. The draft's
own KV (one layer for EAGLE/MTP, a whole small model for draft:NAME) is read on
every draft forward. Prefill is priced as one forward over the prompt tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specrl.sim.costs import Layout, forward_cost
from specrl.sim.drafters import Drafter
from specrl.sim.hardware import Device
from specrl.sim.models import ModelSpec


@dataclass(frozen=True)
class Engine:
    """One inference replica: device type, target model, layout and drafter."""

    device: Device
    model: ModelSpec
    layout: Layout = field(default_factory=Layout)
    drafter: Drafter | None = None

    def target_time(self, batch: int, k: int, kv_tokens) -> np.ndarray:
        """Target forward verifying K drafts (K = 0: a plain decode step) for `batch` sequences."""
        if batch <= 0:
            return np.zeros_like(np.asarray(kv_tokens, dtype=float))
        return forward_cost(self.device, self.model, self.layout, batch * (k + 1), kv_tokens, k + 1).total

    def draft_time(self, batch: int, k: int, kv_tokens) -> np.ndarray:
        """K sequential draft forwards over `batch` tokens each, plus host drafting work."""
        kv = np.asarray(kv_tokens, dtype=float)
        if k == 0 or batch <= 0 or self.drafter is None:
            return np.zeros_like(kv)
        host = self.drafter.host_s_per_seq * batch
        if self.drafter.network is None:
            return host + np.zeros_like(kv)
        net = self.drafter.network
        # A draft network caches its own (1-layer or small-model) KV for the same tokens.
        one = forward_cost(self.device, net, self.layout, batch, kv, 1.0).total
        return k * one + host

    def iteration_time(self, batch: int, k: int, kv_tokens) -> np.ndarray:
        """Seconds for one engine iteration over `batch` live sequences holding `kv_tokens` cached tokens."""
        step = self.device.efficiency.step_overhead_s
        return step + self.target_time(batch, k, kv_tokens) + self.draft_time(batch, k, kv_tokens)

    def prefill_time(self, prompt_tokens: float) -> float:
        """One forward over all admitted prompt tokens (no cache to read)."""
        if prompt_tokens <= 0:
            return 0.0
        cost = forward_cost(self.device, self.model, self.layout, prompt_tokens, 0.0, 1.0)
        return float(cost.total) + self.device.efficiency.step_overhead_s
