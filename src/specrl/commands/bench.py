"""`specrl bench rollout` (speculation off vs on), `specrl bench drafters` (every proposer on the
same prompts), `specrl bench async` (async GRPO with speculation vs sync without) and `specrl bench
kernel` (the projections' kernels): variants alternate and medians are reported; `specrl bench
exactness` tests each variant's responses against the exact distribution. Each ends with one JSON line."""
from __future__ import annotations

from rich.table import Table

from specrl.bench.async_bench import AsyncBenchConfig, run_async_bench
from specrl.bench.drafters_bench import DraftersBenchConfig, run_drafters_bench
from specrl.bench.exactness_bench import ExactnessBenchConfig, run_exactness_bench
from specrl.bench.kernel_bench import KernelBenchConfig, run_kernel_bench
from specrl.bench.verification_bench import VerificationBenchConfig, run_verification_bench
from specrl.bench.rollout_bench import RolloutBenchConfig, run_rollout_bench
from specrl.bench.trl_peer import TRLBenchConfig, run_trl_bench
from specrl.commands.common import add_threads_flag, console, progress_bar, set_threads
from specrl.speculation.proposer_registry import MODEL_DRAFTS, PROPOSER_NAMES
from specrl.validation import choices


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks (each ends with one JSON line)")
    kinds = bench.add_subparsers(dest="bench", metavar="KIND", required=True)
    p = kinds.add_parser("rollout", help="rollout throughput, speculation off vs on, plus transformers generate",
                         description="Runs the same reasoning prompts with speculation off and on, alternating, "
                                     "and reports median tokens/s, acceptance and exactness checks.")
    d = RolloutBenchConfig()
    p.add_argument("--model", default=d.model, help="tiny | smollm2-135m | checkpoint dir (default: %(default)s)")
    p.add_argument("--proposer", default=d.proposer, choices=PROPOSER_NAMES, help="speculative variant")
    p.add_argument("--draft", default=d.draft,
                   help="draft / eagle3 / mtp checkpoint (default: the model's registered one for the proposer)")
    p.add_argument("--backend", default=d.backend, choices=choices(RolloutBenchConfig, "backend"))
    p.add_argument("--batch", type=int, default=d.batch, help="rows per call = prompts x n (default: %(default)s)")
    p.add_argument("--n", type=int, default=d.n, help="samples per prompt, a GRPO group (default: %(default)s)")
    p.add_argument("--no-hf", action="store_true", help="skip timing transformers generate")
    p.add_argument("--tree-width", type=int, default=d.tree_width,
                   help="with --fixed-k: draft every step as a tree of this many candidate first tokens, each "
                        "with K-1 drafts (EAGLE-3 / MTP heads; default %(default)s = a chain)")
    p.add_argument("--verification", default=d.verification, choices=choices(RolloutBenchConfig, "verification"),
                   help="how a chain's drafts are accepted, both exact: block (jointly) or token (one by one) "
                        "(default: the backend's own, block on the embedded engine)")
    p.add_argument("--no-compile", action="store_true",
                   help="run the embedded engine eager (PyTorch/MKL) instead of its fast path")
    p.add_argument("--eager-baseline", action="store_true",
                   help="also time decoding on the eager path, alternating, and report fast_vs_eager")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="prefill every prompt whole on both variants (by default each reuses the K/V of the first "
                        "tokens a call's prompts share with the last call's first prompt: the chat template)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every row generates --max-tokens, past EOS: both variants time the same token count at a "
                        "batch that does not drain (at temperature 1 their responses, and so their lengths, differ)")
    p.add_argument("--rows-per-round", type=int, default=d.rows_per_round,
                   help="each round times at least this many rows per variant, in calls of --batch rows on their own "
                        "prompts (at batch 1 one response's length would decide the round; default: %(default)s)")
    _add_sampling_flags(p, d)
    p.set_defaults(func=run)

    c = DraftersBenchConfig()
    q = kinds.add_parser("drafters", help="every proposer on the same prompts: a table and a speedup-vs-batch plot",
                         description="For each batch size, runs plain decoding and every proposer (n-gram, group suffix, "
                                     "draft model, EAGLE-3 head, MTP head, hybrid) on the same prompts and seeds, "
                                     "alternating, for --rounds rounds. Prints acceptance length, acceptance per "
                                     "position, median speedup and the proposer's share of wall time, writes a PNG of "
                                     "speedup against batch size, and ends with one JSON line. Proposers whose "
                                     "checkpoint is missing are skipped and named.")
    q.add_argument("--model", default=c.model, help="tiny | smollm2-135m | checkpoint dir (default: %(default)s)")
    q.add_argument("--proposers", default=",".join(c.proposers), help="comma-separated subset of " + ",".join(PROPOSER_NAMES))
    q.add_argument("--batches", default=",".join(map(str, c.batches)), help="comma-separated batch sizes (default: %(default)s)")
    q.add_argument("--n", type=int, default=c.n, help="samples per prompt, capped at the batch (default: %(default)s)")
    q.add_argument("--hybrid-model", default=c.hybrid_model, choices=MODEL_DRAFTS,
                   help="the model-draft half of the hybrid (default: %(default)s)")
    q.add_argument("--plot", default=c.plot, help="PNG path for the speedup plot (default: %(default)s)")
    q.add_argument("--verification", default=",".join(c.verifications),
                   help="comma-separated chain verification rules to run every proposer under, side by side: "
                        "block (joint, the engine's default) and token (one by one) (default: %(default)s)")
    _add_sampling_flags(q, c)
    q.set_defaults(func=run_drafters)

    v = VerificationBenchConfig()
    vb = kinds.add_parser("verification", help="block vs token verification: each rule's expected acceptance length "
                                                "on the same draft chains",
                          description="Runs each proposer at a fixed chain of K drafts and, at every verify step, "
                                      "computes in closed form how many drafts token-by-token and block verification "
                                      "accept in expectation on that step's drafts, q and p. Reports both acceptance "
                                      "lengths, their paired difference with its standard error, and the run's "
                                      "realised acceptance length. Ends with one JSON line.")
    vb.add_argument("--model", default=v.model, help="tiny | smollm2-135m | checkpoint dir (default: %(default)s)")
    vb.add_argument("--proposers", default=",".join(v.proposers),
                    help="comma-separated subset of " + ",".join(PROPOSER_NAMES) + " (default: %(default)s)")
    vb.add_argument("--k", type=int, default=v.k, help="drafts per chain, every step (default: %(default)s)")
    vb.add_argument("--batch", type=int, default=v.batch, help="rows per call (default: %(default)s)")
    vb.add_argument("--calls", type=int, default=v.calls, help="calls per proposer (default: %(default)s)")
    vb.add_argument("--max-tokens", type=int, default=v.max_tokens, help="(default: %(default)s)")
    vb.add_argument("--temperature", type=float, default=v.temperature, help="(default: %(default)s)")
    vb.add_argument("--top-p", type=float, default=v.top_p, help="(default: %(default)s)")
    vb.add_argument("--top-k", type=int, default=v.top_k, help="(default: %(default)s = off)")
    vb.add_argument("--seed", type=int, default=v.seed, help="call i uses seed + i (default: %(default)s)")
    add_threads_flag(vb)
    vb.set_defaults(func=run_verification)

    e = KernelBenchConfig()
    t = kinds.add_parser("kernel", help="one pass over a model's projections: eager (MKL) vs the fast path, and the int8 "
                                           "self-draft's kernels, per row count",
                         description="Times the engine's projections and LM head at the model's shapes (random weights) "
                                     "for each row count M, eager and on the fast path (specrl's small-row kernel), "
                                     "and with the weights rounded to int8 on each int8 kernel this CPU runs (the "
                                     "self-draft's), alternating; prints median ms per pass, the weight-streaming "
                                     "rate and each int8 pass as a share of the fp32 fast path's.")
    t.add_argument("--model", default=e.model, help="whose shapes (default: %(default)s)")
    t.add_argument("--rows", default=",".join(map(str, e.rows)), help="comma-separated M values (default: %(default)s)")
    t.add_argument("--rounds", type=int, default=e.rounds, help="timed rounds; medians reported (default: %(default)s)")
    add_threads_flag(t)
    t.set_defaults(func=run_kernel)

    x = ExactnessBenchConfig()
    ex = kinds.add_parser("exactness", help="each speculative variant's whole responses against the exact distribution "
                                            "(one-sample z per variant, no second sample needed)",
                          description="For --samples prompts, samples one response per variant (no speculation, the "
                                      "adaptive controller, a fixed K-chain and, for heads, a width-3 tree), one row "
                                      "per call with its own seed, then scores every token against the exact "
                                      "conditional from a clean transformers forward: z = sum(log p(x) + H(p)) / "
                                      "sqrt(sum Var[log p]) is N(0, 1) for an exact sampler (also per response "
                                      "position). Ends with one JSON line.")
    ex.add_argument("--model", default=x.model, help="(default: %(default)s)")
    ex.add_argument("--proposer", default=x.proposer, choices=PROPOSER_NAMES, help="(default: %(default)s)")
    ex.add_argument("--samples", type=int, default=x.samples, help="prompts, one call each per variant "
                                                                  "(default: %(default)s)")
    ex.add_argument("--max-tokens", type=int, default=x.max_tokens, help="(default: %(default)s)")
    ex.add_argument("--k", type=int, default=x.k, help="the fixed chain's and tree's depth (default: %(default)s)")
    ex.add_argument("--temperature", type=float, default=x.temperature, help="(default: %(default)s)")
    ex.add_argument("--seed", type=int, default=x.seed, help="call i uses seed + i (default: %(default)s)")
    add_threads_flag(ex)
    ex.set_defaults(func=run_exactness)

    a = AsyncBenchConfig()
    r = kinds.add_parser("async", help="async GRPO with speculation vs sync GRPO without (whole runs, alternating)",
                         description="Runs `specrl train --preset PRESET` twice per round as subprocesses, sync without "
                                     "speculation and async (Ray rollout actors) with --proposer, alternating which goes "
                                     "first. Reports the median ratio sync / async of the whole process's wall time and "
                                     "of the training loop (less actor start-up), and the reward of each fifth of the runs.")
    r.add_argument("--preset", default=a.preset, help="the run to compare (default: %(default)s)")
    r.add_argument("--steps", type=int, default=a.steps, help="GRPO steps per run (default: %(default)s)")
    r.add_argument("--rounds", type=int, default=a.rounds, help="rounds of both runs; medians reported")
    r.add_argument("--proposer", default=a.proposer, choices=choices(AsyncBenchConfig, "proposer"),
                   help="the async run's proposer (default: %(default)s)")
    r.add_argument("--max-staleness", type=int, default=a.max_staleness, help="the async run's staleness bound")
    r.set_defaults(func=run_async)

    tc = TRLBenchConfig()
    tr = kinds.add_parser("trl", help="specrl's GRPO against TRL's GRPOTrainer on the same job (needs the peers extra)",
                          description="Runs the job `specrl train --preset PRESET --config CONFIG` for --steps steps "
                                      "under specrl and under TRL's GRPOTrainer (pip install -e '.[peers]'): the same "
                                      "model, problems, prompts, rewards, group size, prompts per step, response cap, "
                                      "temperature, learning rate and clip range. Reports each side's seconds per "
                                      "step, rollout and training tokens per second, and reward per step, and both "
                                      "configs in full.")
    tr.add_argument("--preset", default=tc.preset, help="(default: %(default)s)")
    tr.add_argument("--config", default=tc.config, help="run config file on top of the preset (default: %(default)s)")
    tr.add_argument("--steps", type=int, default=tc.steps, help="GRPO steps per run (default: %(default)s)")
    tr.add_argument("--rounds", type=int, default=tc.rounds, help="rounds of both runs, alternating which goes first")
    tr.add_argument("--seed", type=int, default=tc.seed, help="(default: %(default)s)")
    tr.add_argument("--threads", type=int, default=tc.threads, help="torch threads for both (default: %(default)s)")
    tr.add_argument("--trl-micro-batch", type=int, default=tc.trl_micro_batch,
                    help="TRL's sequences per forward/backward; divides the step's rows (default: %(default)s)")
    tr.set_defaults(func=run_trl)


def _add_sampling_flags(parser, defaults) -> None:
    """K, sampling, rounds, seed and threads: the flags both speculation benches share."""
    parser.add_argument("--k", type=int, default=defaults.k, help="num_speculative_tokens, the most drafts per step "
                                                                   "(default: the proposer's own: 3; int8 8)")
    parser.add_argument("--fixed-k", action="store_true", help="always verify K drafts (no adaptive K)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens,
                        help="response cap (default: 128, or what fits beside the prompt in a shorter context)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="(default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="timed rounds; medians reported "
                                                                           "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="(default: %(default)s)")
    add_threads_flag(parser)


def run(args) -> dict:
    set_threads(args.threads)
    config = RolloutBenchConfig(
        model=args.model, proposer=args.proposer, draft=args.draft, backend=args.backend, batch=args.batch, n=args.n,
        k=args.k, adaptive=not args.fixed_k, tree_width=args.tree_width, verification=args.verification,
        max_tokens=args.max_tokens,
        temperature=args.temperature, ignore_eos=args.ignore_eos,
        rounds=args.rounds, rows_per_round=args.rows_per_round, hf=not args.no_hf, compile=not args.no_compile, eager_baseline=args.eager_baseline,
        prefix_caching=not args.no_prefix_caching, seed=args.seed,
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


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None


def run_drafters(args) -> dict:
    set_threads(args.threads)
    config = DraftersBenchConfig(
        model=args.model, proposers=tuple(p for p in args.proposers.split(",") if p),
        batches=_int_list(args.batches, "--batches"), n=args.n, k=args.k, adaptive=not args.fixed_k,
        hybrid_model=args.hybrid_model, max_tokens=args.max_tokens, temperature=args.temperature,
        rounds=args.rounds, seed=args.seed, plot=args.plot,
        verifications=tuple(v for v in args.verification.split(",") if v),
    )
    rounds = len(config.batches) * config.rounds
    with progress_bar(f"bench drafters {config.model}", rounds) as update:
        summary = run_drafters_bench(config, progress=update)
    table = Table(title=f"drafters: {config.model}, T={config.temperature}, "
                        f"{'adaptive K' if config.adaptive else 'K'} <= {'per proposer' if config.k is None else config.k}")
    for column in ("proposer", "verify", "batch", "tokens/s", "speedup", "accept len", "accept per pos", "draft cost",
                   "K used"):
        table.add_column(column)
    for row in summary["rows"]:
        table.add_row(row["proposer"], row["verification"], str(row["batch"]), f"{row['tokens_per_s']:.1f}", f"{row['speedup']:.2f}x",
                      f"{row['acceptance_length']:.2f}", " ".join(f"{a:.2f}" for a in row["acceptance_per_pos"]),
                      f"{100 * row['draft_cost_share']:.0f}%", str(row["k_histogram"]))
    console.print(table)
    for name, reason in summary["skipped"].items():
        console.print(f"skipped {name}: {reason}")
    if summary.get("plot"):
        console.print(f"plot: {summary['plot']}")
    return summary


def run_async(args) -> dict:
    config = AsyncBenchConfig(preset=args.preset, steps=args.steps, rounds=args.rounds, proposer=args.proposer,
                              max_staleness=args.max_staleness)
    with progress_bar(f"bench async {config.preset}", config.rounds) as update:
        summary = run_async_bench(config, progress=update)
    console.print(f"sync / async: whole process {summary['wall_ratio_median']:.2f}x, "
                  f"training loop {summary['loop_ratio_median']:.2f}x")
    return summary


def run_trl(args) -> dict:
    config = TRLBenchConfig(preset=args.preset, config=args.config, steps=args.steps, rounds=args.rounds,
                            seed=args.seed, threads=args.threads, trl_micro_batch=args.trl_micro_batch)
    with progress_bar("bench trl", config.rounds) as update:
        summary = run_trl_bench(config, progress=update)
    table = Table(title=f"GRPO on the same job: {config.preset} + {config.config}, {config.steps} steps")
    for column in ("", "s / step", "rollout tok/s", "training tok/s", "reward per step"):
        table.add_column(column)
    for side in ("specrl", "trl"):
        row = summary[side]
        table.add_row(side, f"{row['step_seconds']:.1f}", f"{row['rollout_tokens_per_s']:.0f}",
                      f"{row['training_tokens_per_s']:.0f}", " ".join(f"{r:.2f}" for r in row["reward_per_step"]))
    console.print(table)
    return summary


def run_exactness(args) -> dict:
    set_threads(args.threads)
    config = ExactnessBenchConfig(model=args.model, proposer=args.proposer, samples=args.samples,
                                  max_tokens=args.max_tokens, k=args.k, temperature=args.temperature, seed=args.seed)
    with progress_bar(f"bench exactness {config.model} {config.proposer}", 2 * config.samples) as update:
        summary = run_exactness_bench(config, progress=update)
    table = Table(title=f"exactness: {config.model}, {config.proposer}, T={config.temperature}, "
                        f"{config.samples} responses per variant")
    for column in ("variant", "tokens", "z (N(0, 1) if exact)", "z per position 1..6"):
        table.add_column(column)
    for name, row in summary["variants"].items():
        table.add_row(name, str(row["tokens"]), f"{row['z']:+.2f}", str(row["z_per_position"]))
    console.print(table)
    return summary


def run_verification(args) -> dict:
    set_threads(args.threads)
    config = VerificationBenchConfig(model=args.model, proposers=tuple(p for p in args.proposers.split(",") if p),
                                     k=args.k, batch=args.batch, calls=args.calls, max_tokens=args.max_tokens,
                                     temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    with progress_bar(f"bench verification {config.model}", len(config.proposers) * config.calls) as update:
        summary = run_verification_bench(config, progress=update)
    table = Table(title=f"block vs token verification: {config.model}, K={config.k}, batch {config.batch}, "
                        f"T={config.temperature}")
    for column in ("proposer", "chains", "accept len token", "accept len block", "gain (± s.e.)", "realised"):
        table.add_column(column)
    for row in summary["rows"]:
        table.add_row(row["proposer"], str(row["chains"]), f"{row['acceptance_length_token']:.3f}",
                      f"{row['acceptance_length_block']:.3f}", f"{row['gain']:+.3f} ± {row['gain_stderr']:.3f}",
                      f"{row['realised_acceptance_length']:.2f}")
    console.print(table)
    return summary


def run_kernel(args) -> dict:
    set_threads(args.threads)
    config = KernelBenchConfig(model=args.model, rows=_int_list(args.rows, "--rows"), rounds=args.rounds)
    with progress_bar(f"bench kernel {config.model}", len(config.rows)) as update:
        summary = run_kernel_bench(config, progress=update)
    table = Table(title=f"projections of {config.model} ({summary['weights_mb']:.0f} MB), {summary['threads']} threads")
    int8 = summary["int8_kernels"]
    for column in ("rows M", "eager ms", "fast ms", "speedup", "fast GB/s", *(f"{name} ms (/ fast)" for name in int8)):
        table.add_column(column)
    for row in summary["rows"]:
        table.add_row(str(row["rows"]), f"{row['eager_ms']:.1f}", f"{row['fast_ms']:.1f}", f"{row['speedup']:.2f}x",
                      f"{row['fast_gb_per_s']:.1f}",
                      *(f"{row[name + '_ms']:.1f} ({row[name + '_vs_fast']:.2f})" for name in int8))
    console.print(table)
    return summary
