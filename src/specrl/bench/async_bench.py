"""Benchmark: async GRPO with speculation vs sync GRPO without, same preset and number of steps.

    specrl bench async --preset tiny --steps 100 --rounds 3 [--proposer ngram]

Each round runs both as `specrl train` subprocesses, alternating which goes first, and
reads their closing JSON lines. Two times per run:
    wall: the whole process (imports, model load, Ray start, actor start-up, the loop);
    loop: the run's own stage timers, less the async actors' start-up (the steady-state cost).
Ratios are sync / async (> 1 = async is faster); medians over rounds. The reward
curves are compared as the mean reward of each fifth of the run, averaged over rounds.
Progress goes to stderr; the last stdout line is one JSON object.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from specrl.bench import Bench
from specrl.bench.train_run import run_train
from specrl.speculation.proposer_registry import PROPOSER_NAMES
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class AsyncBenchConfig:
    """One comparison: a preset run sync without speculation and async with it."""

    SECTION: ClassVar[str] = "bench async"

    preset: str = "tiny"  # the run to compare
    steps: int = within(100, "[5, inf)")  # GRPO steps per run
    rounds: int = within(3, "[1, inf)")  # rounds of both runs; medians are reported
    proposer: Literal[PROPOSER_NAMES] = "ngram"  # type: ignore[valid-type]  # the async run's proposer
    max_staleness: int = within(1, "[0, inf)")  # the async run's staleness bound
    threads: int | None = within(None, "[1, inf)")  # torch CPU threads; None = all cores

    def __post_init__(self):
        check_fields(self)


def fifths(rewards: list[float]) -> list[float]:
    """Mean reward of each fifth of the run (the last fifth takes the remainder)."""
    size = max(1, len(rewards) // 5)
    return [statistics.mean(rewards[i * size:(i + 1) * size if i < 4 else None]) for i in range(5)]


def run_async_bench(config: AsyncBenchConfig, progress=None) -> dict:
    variants = {
        "sync_no_spec": ["pipeline.mode=sync", "backend.proposer=none"],
        "async_spec": ["pipeline.mode=async", f"backend.proposer={config.proposer}",
                       f"pipeline.max_staleness={config.max_staleness}"],
    }
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(config.rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                result = run_train(config.preset, config.steps, Path(tmp) / name, variants[name], config.threads)
                runs[name].append(result)
                print(f"round {round_ + 1}/{config.rounds} {name}: wall {result['wall_s']:.1f}s loop "
                      f"{result['loop_s']:.1f}s reward last fifth {fifths(result['rewards'])[-1]:.3f}", file=sys.stderr)
            if progress is not None:
                progress(round_ + 1, config.rounds)
    sync, fast = runs["sync_no_spec"], runs["async_spec"]

    def describe(results: list[dict]) -> dict:
        last = results[-1]["summary"]
        return {"wall_s_median": statistics.median(r["wall_s"] for r in results),
                "loop_s_median": statistics.median(r["loop_s"] for r in results),
                "reward_fifths": [statistics.mean(f) for f in zip(*(fifths(r["rewards"]) for r in results))],
                "timing": last["timing"], "acceptance_length": last["acceptance_length"],
                "max_staleness_seen": last["max_staleness_seen"], "dropped": last.get("dropped", 0)}

    return {
        "preset": config.preset, "steps": config.steps, "rounds": config.rounds, "proposer": config.proposer,
        "max_staleness": config.max_staleness,
        "wall_ratio_median": statistics.median(s["wall_s"] / a["wall_s"] for s, a in zip(sync, fast)),
        "loop_ratio_median": statistics.median(s["loop_s"] / a["loop_s"] for s, a in zip(sync, fast)),
        "sync_no_spec": describe(sync), "async_spec": describe(fast),
    }


def report(summary: dict, config: AsyncBenchConfig, console) -> None:
    console.print(f"sync / async: whole process {summary['wall_ratio_median']:.2f}x, "
                  f"training loop {summary['loop_ratio_median']:.2f}x")


BENCH = Bench(AsyncBenchConfig, run_async_bench, report, steps=lambda c: c.rounds,
              help="async GRPO with speculation vs sync GRPO without (whole runs, alternating)",
              description="Runs `specrl train --preset PRESET` twice per round as subprocesses, sync without "
                          "speculation and async (Ray rollout actors) with --proposer, alternating which goes first. "
                          "Reports the median ratio sync / async of the whole process's wall time and of the training "
                          "loop (less actor start-up), and the reward of each fifth of the runs.")
