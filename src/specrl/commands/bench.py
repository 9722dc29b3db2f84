"""`specrl bench rollout`: speculation off vs on, one process, alternating; ends with one JSON line."""
from __future__ import annotations

from rich.table import Table

from specrl.bench.rollout import RolloutBenchConfig, run_rollout_bench
from specrl.commands.common import add_threads_flag, console, progress_bar, set_threads


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks (each ends with one JSON line)")
    kinds = bench.add_subparsers(dest="bench", metavar="KIND", required=True)
    p = kinds.add_parser("rollout", help="rollout throughput, speculation off vs on, plus transformers generate",
                         description="Runs the same reasoning prompts with speculation off and on, alternating, "
                                     "and reports median tokens/s, acceptance and exactness checks.")
    d = RolloutBenchConfig()
    p.add_argument("--model", default=d.model, help="tiny | smollm2-135m | checkpoint dir (default: %(default)s)")
    p.add_argument("--proposer", default=d.proposer, choices=["ngram", "suffix", "draft"], help="speculative variant")
    p.add_argument("--draft", default=d.draft, help="draft checkpoint (default: the model's registered draft)")
    p.add_argument("--backend", default=d.backend, choices=["embedded", "vllm"])
    p.add_argument("--batch", type=int, default=d.batch, help="rows per call = prompts x n (default: %(default)s)")
    p.add_argument("--n", type=int, default=d.n, help="samples per prompt, a GRPO group (default: %(default)s)")
    p.add_argument("--k", type=int, default=d.k, help="num_speculative_tokens, the most drafts per step")
    p.add_argument("--fixed-k", action="store_true", help="always verify K drafts (no adaptive K)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--rounds", type=int, default=d.rounds, help="timed rounds; medians reported")
    p.add_argument("--no-hf", action="store_true", help="skip timing transformers generate")
    p.add_argument("--seed", type=int, default=d.seed)
    add_threads_flag(p)
    p.set_defaults(func=run)


def run(args) -> dict:
    set_threads(args.threads)
    config = RolloutBenchConfig(
        model=args.model, proposer=args.proposer, draft=args.draft, backend=args.backend, batch=args.batch, n=args.n,
        k=args.k, adaptive=not args.fixed_k, max_tokens=args.max_tokens, temperature=args.temperature,
        rounds=args.rounds, hf=not args.no_hf, seed=args.seed,
    )
    with progress_bar(f"bench {config.model} {config.proposer} batch={config.batch}", config.rounds) as update:
        summary = run_rollout_bench(config, progress=update)
    table = Table(title=f"rollout: {config.model}, {config.proposer}, batch {config.batch}, T={config.temperature}")
    for column in ("variant", "tokens/s", "vs base"):
        table.add_column(column)
    base = summary["tokens_per_s_base"]
    table.add_row("base (no speculation)", f"{base:.1f}", "1.00x")
    table.add_row(f"speculative ({config.proposer})", f"{summary['tokens_per_s_spec']:.1f}", f"{summary['speedup']:.2f}x")
    if summary["tokens_per_s_hf"]:
        table.add_row("transformers generate", f"{summary['tokens_per_s_hf']:.1f}", f"{summary['tokens_per_s_hf'] / base:.2f}x")
    console.print(table)
    console.print(f"acceptance length {summary['acceptance_length']:.2f}, rate {summary['acceptance_rate']:.2f}, "
                  f"per position {[round(a, 2) for a in summary['acceptance_per_pos']]}, K used {summary['k_histogram']}; "
                  f"greedy match {summary['greedy_match']}; mean logprob base {summary['mean_logprob_base']:.3f} "
                  f"spec {summary['mean_logprob_spec']:.3f}")
    return summary
