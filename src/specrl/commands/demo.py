"""`specrl demo` (what `make demo` runs): speculative rollouts on `tiny`, off vs on, with samples.

Until the GRPO trainer lands this is the main job the project can show: the same
arithmetic prompts rolled out with and without exact speculation, the speedup, the
acceptance per draft position, and a few sampled responses with their rewards.
"""
from __future__ import annotations

from specrl.commands import bench
from specrl.commands.common import add_threads_flag, console


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="the quick demo: speculative rollouts on the tiny model, off vs on",
                              description="Rolls out arithmetic prompts on the tiny model with and without "
                                          "speculation (draft model, K=3) and prints speedup and samples.")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    add_threads_flag(p)
    p.set_defaults(func=run)


def run(args) -> dict:
    import argparse

    from specrl.backends import BackendConfig, make_backend
    from specrl.engine.sampling import SamplingParams
    from specrl.models.arithmetic import ArithmeticConfig, generate_problems, score

    bench_args = argparse.Namespace(model="tiny", proposer="draft", draft=None, backend="embedded", batch=args.batch,
                                    k=3, fixed_k=False, max_tokens=32, temperature=1.0, rounds=args.rounds,
                                    no_hf=False, seed=0, threads=args.threads)
    summary = bench.run(bench_args)
    backend = make_backend(BackendConfig(model="tiny", proposer="draft"))
    problems = generate_problems(ArithmeticConfig(), 4, seed=1, split="test")
    result = backend.generate([p.prompt for p in problems], SamplingParams(max_tokens=32, seed=1))
    for problem, completion in zip(problems, result.completions):
        console.print(f"  {problem.prompt!r} -> {completion.text!r}  reward {score(problem, completion.text)}")
    return summary
