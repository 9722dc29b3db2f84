"""Scenario presets: the workloads and clusters the simulator projects (one place).

Workload numbers the papers do not publish are assumptions, written here once
and reported with every result:
  seed-8b-sync     Qwen3-8B GRPO RL-Zero on 32 GB200, 512 prompts x 16, prompt 256,
                   lengths log-normal mean 2500, sigma 0.9, cap 16384, 2% at the cap;
                   EAGLE-3 K=3, acceptance length 2.05 (the seed's RL-Zero figure).
  seed-235b-async  Qwen3-235B-A22B on 2048 GB200, replicas of 16 GPUs (TP4 x EP16),
                   1024 prompts x 16, prompt 512, mean 6000, sigma 0.9, cap 32768, 3% at
                   the cap; EAGLE-3 K=3 at acceptance length 2.47 (the seed's RL-Think
                   figure), training MFU 0.25 (MoE); async with staleness 1.
  cpu-tiny         specrl's tiny char-level Llama on this CPU (1 thread, fitted costs),
                   8 prompts x 8, prompt 24 chars, mean 14, cap 40; draft tiny-draft K=3 at
                   acceptance length 2.5 (assumed; replace with `specrl bench` figures).
The acceptance shape (heterogeneity, per-position decay) is the one fitted on the
vLLM H100 K-sweep; only its mean is set from each scenario's acceptance length.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal
from functools import lru_cache

from specrl.sim import published
from specrl.sim.acceptance import Acceptance, fit_acceptance, with_length
from specrl.sim.costs import Layout
from specrl.sim.drafters import get_drafter
from specrl.sim.hardware import get_device
from specrl.sim.models import get_model
from specrl.sim.rl_loop import RLSetup
from specrl.sim.speculation import FixedK, OracleK, PlannedK
from specrl.sim.workload import LengthDistribution, Workload


@lru_cache(maxsize=1)
def acceptance_shape() -> Acceptance:
    """Heterogeneity and decay fitted once on the published vLLM H100 acceptance lengths at K = 1..7."""
    return fit_acceptance(published.VLLM_H100_ACCEPTANCE)


@dataclass(frozen=True)
class Scenario:
    """A named projection: cluster, model, workload, drafter and how the step is run.

    mode: "sync" or "async". k: drafts per iteration with speculation on (the most, for the planner).
    acceptance_length: aggregate acceptance length at K (sets the acceptance mean).
    shared_prompt: price the trainer with each prompt computed once per group (specrl's packed trainer)
    rather than once per sequence (the seed's).
    controller: who picks K each iteration: "planned", the embedded engine's planner users get (K up to k,
    0 where it does not pay); "fixed", always k (the seed's setting); "oracle", the best K for the true
    acceptance and costs (an upper bound, not a controller anyone runs).
    """

    name: str
    device: str
    gpus: int
    model: str
    layout: Layout
    workload: Workload
    drafter: str
    k: int
    acceptance_length: float
    mode: str = "sync"
    train_mfu: float = 0.35
    max_seqs: int = 256
    notes: str = ""
    extra: dict = field(default_factory=dict)
    controller: Literal["planned", "fixed", "oracle"] = "planned"
    shared_prompt: bool = False  # the trainer computes each prompt once per group (the seed's does not)

    def acceptance(self) -> Acceptance:
        return with_length(acceptance_shape(), self.k, self.acceptance_length)

    def setup(self, k: int | None = None, acceptance: Acceptance | None = None, policy=None) -> RLSetup:
        """The RL setup with `k` drafts (default the scenario's K; 0 = speculation off)."""
        model = get_model(self.model)
        k = self.k if k is None else k
        return RLSetup(
            device=get_device(self.device), gpus=self.gpus, model=model, layout=self.layout,
            workload=self.workload, acceptance=acceptance or self.acceptance(),
            policy=policy or self.policy(k, acceptance or self.acceptance()),
            drafter=get_drafter(self.drafter, model) if k else None,
            train_mfu=self.train_mfu, max_seqs=self.max_seqs, shared_prompt=self.shared_prompt,
        )

    def policy(self, k: int, acceptance: Acceptance):
        """A fresh speculation policy of this scenario's `controller` with up to `k` drafts (0: off)."""
        if k == 0 or self.controller == "fixed":
            return FixedK(k)
        if self.controller == "oracle":
            return OracleK(acceptance, candidates=tuple(range(k + 1)))
        return PlannedK(k)

    def with_changes(self, **changes) -> "Scenario":
        return replace(self, **changes)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "seed-8b-sync", "gb200", 32, "qwen3-8b", Layout(tp=1),
            Workload(512, 16, 256, LengthDistribution(2500, 0.9, 16384, 0.02)), "eagle3", 3,
            published.SEED_8B["acceptance_length_k3"], notes="seed 8B synchronous, RL-Zero",
        ),
        Scenario(
            "seed-235b-async", "gb200", 2048, "qwen3-235b-a22b", Layout(tp=4, ep=16),
            Workload(1024, 16, 512, LengthDistribution(6000, 0.9, 32768, 0.03)), "eagle3", 3, 2.47,
            mode="async", train_mfu=0.25, notes="seed 235B projection: async + speculation",
        ),
        Scenario(
            "cpu-tiny", "cpu", 1, "tiny", Layout(),
            Workload(8, 8, 24, LengthDistribution(14, 0.4, 40, 0.0)), "draft:tiny-draft", 3, 2.5,
            train_mfu=0.05, max_seqs=256, notes="specrl tiny model on this CPU, 1 thread",
        ),
    ]
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {sorted(SCENARIOS) + ['calibrate']}") from None
