"""Benchmark: GRPO's rollouts with speculation against without, over several seeds.

    specrl bench grpo --preset smollm2-135m --proposer int8 --steps 6 --seeds 8

A run's rollout tokens per second depend on what it sampled: the longer its answers, the more rows stay live
in each decode step and the more tokens a step yields. With speculation on, a run of the same seed samples
other answers than the plain run (the same law, other draws: the planner's choices, which follow measured
times, change which random numbers each draw takes, and the policy trains on what was drawn). So one pair of
runs compares samples as much as speculation (docs/benchmarks.md, "GRPO with speculation on and off": plain
runs of SmolLM2's preset sampled 3,250 to 6,379 tokens in 6 steps, seed by seed). `--drafter-invariant` makes
both runs of a seed sample the same answers (`rollout.drafter_invariant`), so the pair compares speed alone, at
the acceptance of that rule, not of the default one. Each round here is one seed:
`specrl train` with and without `--proposer` as subprocesses, alternating which goes first, and the figures are

    pooled_ratio        rollout tokens/s with speculation over without, each pooled over the seeds (all
                        their tokens over all their generation seconds): the headline. Where one side sampled
                        shorter answers its batches drained sooner, and fewer tokens a step lowers its figure
    seconds_ratio       generation seconds without speculation over with, each summed over the seeds: as
                        exactness makes both sides' answers follow one law, both did the same work in
                        expectation; it spreads with the tokens each side happened to sample
    ratio_per_seed      each seed's pair, and their median
    speculation_gain    per speculative run: its decode steps priced as plain decoding over what they took
                        (same samples, so free of the spread above; the planner's prices, not a timing of plain)
    tokens              what each run sampled, to show the spread the ratio rests on

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
class GRPOBenchConfig:
    """One comparison: a preset's GRPO runs with and without a proposer, seed by seed."""

    SECTION: ClassVar[str] = "bench grpo"

    preset: str = "smollm2-135m"  # the run to compare (`specrl train --preset`)
    proposer: Literal[PROPOSER_NAMES] = "int8"  # type: ignore[valid-type]  # the speculative runs' proposer
    # GRPO steps per run. The planner explores in a run's first ~15 calls; where a step generates in tens of ms
    # (`tiny`) that cost needs ~60 steps to fade: n-gram drafts read 0.79x over 10 steps, 1.02x over 60
    steps: int = within(6, "[1, inf)")
    # rounds: seeds first_seed, first_seed + 1, ...; one pair of runs each (on SmolLM2 four seeds read 0.97x and
    # six others 1.13x: a run's tokens move by a quarter with its seed)
    seeds: int = within(8, "[1, inf)")
    first_seed: int = 0
    # both runs of a seed draw rollouts with noise keyed by each token's place (`rollout.drafter_invariant`): they
    # sample the same answers (`same_token_counts`), so the ratio compares speed alone, at that rule's acceptance
    drafter_invariant: bool = False
    threads: int | None = within(None, "[1, inf)")  # torch CPU threads of each run; None = all cores

    def __post_init__(self):
        check_fields(self)


def pooled_ratio(spec_runs: list[dict], plain_runs: list[dict]) -> float:
    """Rollout tokens/s of `spec_runs` over that of `plain_runs`, each all its runs' tokens over all their
    generation seconds (run summaries' `rollout_tokens` and `rollout_generation_s`)."""
    def rate(runs: list[dict]) -> float:
        return sum(r["rollout_tokens"] for r in runs) / sum(r["rollout_generation_s"] for r in runs)
    return rate(spec_runs) / rate(plain_runs)


def run_grpo_bench(config: GRPOBenchConfig, progress=None) -> dict:
    common = ["eval.every=0", f"rollout.drafter_invariant={str(config.drafter_invariant).lower()}"]
    variants = {"none": ["backend.proposer=none", *common], config.proposer: [f"backend.proposer={config.proposer}",
                                                                               *common]}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    seeds = list(range(config.first_seed, config.first_seed + config.seeds))
    with tempfile.TemporaryDirectory() as tmp:
        for round_, seed in enumerate(seeds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                summary = run_train(config.preset, config.steps, Path(tmp) / name,
                                    [*variants[name], f"run.seed={seed}"], config.threads)["summary"]
                runs[name].append(summary)
                print(f"seed {seed} {name}: {summary['rollout_tokens']} tokens in "
                      f"{summary['rollout_generation_s']:.1f} s of generation, "
                      f"{summary['rollout_tokens_per_s']:.1f} tokens/s", file=sys.stderr)
            if progress is not None:
                progress(round_ + 1, config.seeds)
    plain, spec = runs["none"], runs[config.proposer]
    ratios = [s["rollout_tokens_per_s"] / p["rollout_tokens_per_s"] for s, p in zip(spec, plain)]
    return {
        "preset": config.preset, "proposer": config.proposer, "steps": config.steps, "seeds": seeds,
        "threads": config.threads, "drafter_invariant": config.drafter_invariant,
        # per seed: both runs sampled as many rollout tokens (with drafter_invariant, the same answers)
        "same_token_counts": [s["rollout_tokens"] == p["rollout_tokens"] for s, p in zip(spec, plain)],
        "pooled_ratio": pooled_ratio(spec, plain),
        "seconds_ratio": (sum(p["rollout_generation_s"] for p in plain)
                          / sum(s["rollout_generation_s"] for s in spec)),
        "ratio_per_seed": ratios, "ratio_median": statistics.median(ratios),
        "speculation_gain": [s["speculation_gain"] for s in spec],
        "tokens": {"none": [p["rollout_tokens"] for p in plain], config.proposer: [s["rollout_tokens"] for s in spec]},
        "tokens_per_s": {"none": [p["rollout_tokens_per_s"] for p in plain],
                         config.proposer: [s["rollout_tokens_per_s"] for s in spec]},
        "generation_s": {"none": [p["rollout_generation_s"] for p in plain],
                         config.proposer: [s["rollout_generation_s"] for s in spec]},
        "acceptance_length": [s["acceptance_length"] for s in spec],
        "plan_reasons": [s["plan_reasons"] for s in spec],
    }


def report(summary: dict, config: GRPOBenchConfig, console) -> None:
    per_seed = ", ".join(f"{r:.2f}" for r in summary["ratio_per_seed"])
    gains = ", ".join(f"{g:.2f}" for g in summary["speculation_gain"] if g is not None)
    console.print(f"rollout tokens/s, {config.proposer} / none, pooled over {config.seeds} seeds: "
                  f"{summary['pooled_ratio']:.2f}x (per seed {per_seed}); generation seconds none / "
                  f"{config.proposer} {summary['seconds_ratio']:.2f}x; speculation_gain {gains}")


BENCH = Bench(GRPOBenchConfig, run_grpo_bench, report, steps=lambda c: c.seeds,
              help="GRPO rollouts with a proposer vs without (whole runs over seeds, alternating)",
              description="Runs `specrl train --preset PRESET` with and without --proposer for each of --seeds seeds "
                          "(subprocesses, alternating which goes first). A run's rollout tokens/s depend on the "
                          "answers it sampled, which differ between the two runs of a seed, so the headline pools "
                          "each side's tokens and generation seconds over the seeds. Also reports each seed's ratio, "
                          "each speculative run's speculation_gain (its decode steps priced as plain decoding) and "
                          "the tokens every run sampled.")
