"""Speculation statistics from vLLM's `vllm:spec_decode_*` counters, as per-call deltas.

vLLM keeps cumulative Prometheus counters (with `disable_log_stats=False`):

    vllm:spec_decode_num_drafts                   verify steps that carried drafts, per request
    vllm:spec_decode_num_draft_tokens             draft tokens proposed
    vllm:spec_decode_num_accepted_tokens          draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos  accepted count at draft position i (a vector)
    vllm:iteration_tokens_total                   a histogram with one observation per engine step

A `generate` call reads them before and after and reports the difference as a
`SpecStats`, the embedded engine's type, under the same names. The counters live in
one process-wide registry, labelled with the engine's `served_model_name`; each
backend gives its engine a unique one and reads only its own labels.

Limit: vLLM unregisters every earlier engine's counters when a new engine starts in
the same process, so only the newest engine in a process can report speculation.
`read_counters` raises when its engine's counters are gone.
"""
from __future__ import annotations

from dataclasses import dataclass

from specrl.telemetry.spec_stats import SpecStats

PREFIX = "vllm:spec_decode_"
STEPS = "vllm:iteration_tokens_total"


@dataclass(frozen=True)
class CounterSnapshot:
    """Cumulative counts of one engine at one moment."""

    spec: SpecStats | None  # None when the engine runs without speculation
    steps: int  # engine steps so far (prefill steps included)

    def minus(self, before: "CounterSnapshot") -> "CounterSnapshot":
        """The counts between `before` and this snapshot."""
        spec = None
        if self.spec is not None and before.spec is not None:
            per_pos = [a - b for a, b in zip(self.spec.num_accepted_tokens_per_pos,
                                             before.spec.num_accepted_tokens_per_pos)]
            spec = SpecStats(num_drafts=self.spec.num_drafts - before.spec.num_drafts,
                             num_draft_tokens=self.spec.num_draft_tokens - before.spec.num_draft_tokens,
                             num_accepted_tokens=self.spec.num_accepted_tokens - before.spec.num_accepted_tokens,
                             num_accepted_tokens_per_pos=per_pos)
        return CounterSnapshot(spec, self.steps - before.steps)


def read_counters(llm, served_name: str, speculative: bool) -> CounterSnapshot:
    """Snapshot the engine's cumulative counters (those labelled model_name=served_name)."""
    values: dict[str, object] = {}
    steps = 0
    for metric in llm.get_metrics():
        if metric.labels.get("model_name") != served_name:
            continue
        if metric.name.startswith(PREFIX):
            values[metric.name[len(PREFIX):]] = metric.values if hasattr(metric, "values") else metric.value
        elif metric.name == STEPS:
            steps = int(metric.count)
    if not speculative:
        return CounterSnapshot(None, steps)
    names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
    missing = [name for name in names if name not in values]
    if missing:
        raise RuntimeError(f"vLLM engine {served_name!r} has no {PREFIX}{missing[0]} counter: vLLM drops an "
                           "engine's metrics when a newer engine starts in the same process; create the "
                           "speculative backend last, or one per process")
    return CounterSnapshot(SpecStats(num_drafts=int(values["num_drafts"]),
                                     num_draft_tokens=int(values["num_draft_tokens"]),
                                     num_accepted_tokens=int(values["num_accepted_tokens"]),
                                     num_accepted_tokens_per_pos=[int(v) for v in values["num_accepted_tokens_per_pos"]]),
                           steps)
