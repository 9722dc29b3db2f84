"""Rollout benchmark: speculation off vs on (and transformers `generate`), alternating in one process.

Each round runs the same prompts through every variant, call by call in turn, with the same seeds (one
per call); tokens per second are the generated tokens over the wall time of the round's calls,
and the reported figure is the median over rounds (these machines are noisy;
`speedup_per_round` shows the spread). At temperature 1 the two variants sample different
responses, so their lengths differ and so does how the batch drains (`mean_response_tokens` and
`mean_response_tokens_spec`). At batch 1 one call's response can be 13 tokens on one side and 72 on
the other, so a round times at least `rows_per_round` rows: ceil(rows_per_round / batch) calls of
the batch, each on its own prompts, which averages the lengths out. `ignore_eos` takes the length
difference out altogether, each row generating max_tokens; `drafter_invariant` takes the sampling difference
out (both variants sample the same responses, `same_samples`), at that rule's acceptance.
A temperature-0 run with and without speculation checks exactness token for token;
at temperature 1 the mean logprob of the sampled tokens must agree within noise
(`logprob_z`: a two-sample z-score over per-sequence means, resting on `logprob_z_sequences` sequences
per side), and so must the response lengths (`length_ks_pvalue`: a two-sample Kolmogorov-Smirnov test).
These are smoke checks with little power at a bench's sample sizes; the exactness tests are the proof.

The step's cost model, for the embedded engine (on its fast path unless `compile` is off):

    verify_cost[e]      T(B, e+1) / T(B, 1): one target pass over e+1 tokens per row (e = k drafts of a
                        chain, or w * k of a fixed tree), in units of a decode step, at the bench's
                        batch B and a mid-response context length
    bound_speedup       tau * T(B, 1) / (T_verify + T_draft): what the speculative steps would give
                        with the measured acceptance length tau (tokens per speculative step), the
                        proposer's measured time per step, and T_verify the mean of T(B, 1 + w k) over
                        the (k, tree width w) the steps ran (from the engine's per-step trace;
                        `bound_step_mix`, `bound_verify_cost` = T_verify / T(B, 1))
    achieved_over_bound the measured speedup over that bound (below 1: exploration, k = 0 steps,
                        the draining batch and bookkeeping)
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from rich.table import Table
from scipy.stats import ks_2samp

from specrl.backends import BackendConfig, make_backend
from specrl.bench import Bench
from specrl.models.checkpoint import load_causal_lm, load_config, load_tokenizer
from specrl.models.llama import Int8Projection, kernels_report
from specrl.models.registry import resolve_checkpoint
from specrl.sampling import SamplingParams
from specrl.speculation.proposer_registry import PROPOSER_NAMES, speculative_tokens
from specrl.tasks.presets import preset_prompts
from specrl.telemetry.spec_stats import SpecStats
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class RolloutBenchConfig:
    """One benchmark: a model, a proposer and a batch, speculation off vs on."""

    SECTION: ClassVar[str] = "bench rollout"

    model: str = "tiny"  # tiny | smollm2-135m | a checkpoint directory
    proposer: Literal[PROPOSER_NAMES] = "draft"  # type: ignore[valid-type]  # the speculative variant; none is the baseline
    draft: str | None = None  # draft checkpoint; None = the model's registered draft
    backend: Literal["embedded", "vllm"] = "embedded"
    batch: int = within(4, "[1, inf)")  # rows per call: prompts x n
    n: int = within(1, "[1, inf)")  # samples per prompt (a GRPO group; the suffix proposer drafts from siblings)
    k: int | None = within(None, "[0, inf)", alias="K")  # num_speculative_tokens; None = the proposer's default
    adaptive: bool = True  # let the engine choose K per step (0 = off), and chain or tree
    tree_width: int = within(1, "[1, inf)")  # with adaptive=False: the tree width of every step (1 = a chain)
    verification: Literal["block", "token"] | None = None  # a chain's acceptance rule; None = the backend's own
    max_tokens: int | None = within(None, "[1, inf)")  # response cap; None = 128, or what fits the model's context
    temperature: float = within(1.0, "[0, inf)")
    # every row generates max_tokens, past EOS: both variants time the same token count over a batch that does
    # not drain (at temperature 1 they sample different responses, whose lengths otherwise differ)
    ignore_eos: bool = False
    # both variants draw with noise keyed by each token's place (`SamplingParams.drafter_invariant`): they sample
    # the same responses, so the ratio compares speed alone, at that rule's acceptance (`same_samples`)
    drafter_invariant: bool = False
    rounds: int = within(3, "[1, inf)")  # timed rounds; medians are reported
    # each round times at least this many rows per variant: ceil(rows_per_round / batch) calls of `batch` rows,
    # each on its own prompts (at batch 1, one response's length decides a one-call round)
    rows_per_round: int = within(8, "[1, inf)")
    hf: bool = True  # also time transformers generate
    compile: bool = True  # the engine's fast path (specrl's small-row kernel); False = eager PyTorch
    eager_baseline: bool = False  # also time decoding without speculation on the eager path (fast_vs_eager)
    # both variants reuse the K/V of the first tokens a call's prompts share with the last call's first prompt
    # (the engine's default; the preset's prompts share a chat template and an instruction); False prefills all
    prefix_caching: bool = True
    seed: int = 0  # call i of a round uses seed + i on every variant
    threads: int | None = within(None, "[1, inf)")  # torch CPU threads; None = all cores

    def __post_init__(self):
        check_fields(self)
        if self.batch % self.n:
            raise ValueError(f"batch {self.batch} must be a multiple of n {self.n} (batch = prompts x n)")


class HFGenerate:
    """transformers `generate` on the same checkpoint, left-padded, as an outside reference."""

    def __init__(self, model: str, tokenizer):
        self.model = load_causal_lm(resolve_checkpoint(model)).eval()
        self.tokenizer = tokenizer
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @torch.inference_mode()
    def timed(self, prompts: list[str], params: SamplingParams) -> tuple[int, float]:
        """(generated tokens, seconds) of one `generate` call."""
        encoded = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        width = max(map(len, encoded))
        ids = torch.tensor([[self.pad] * (width - len(e)) + e for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        if params.seed is not None:
            torch.manual_seed(params.seed)
        start = time.perf_counter()
        sample = {"do_sample": True, "temperature": params.temperature, "top_k": 0} if params.temperature else {"do_sample": False}
        if params.ignore_eos:
            sample["min_new_tokens"] = params.max_tokens
        out = self.model.generate(ids, attention_mask=mask, max_new_tokens=params.max_tokens, pad_token_id=self.pad,
                                  eos_token_id=self.tokenizer.eos_token_id, **sample)
        seconds = time.perf_counter() - start
        new = out[:, width:]
        eos = None if params.ignore_eos else self.tokenizer.eos_token_id
        lengths = [(row.tolist().index(eos) + 1) if eos in row.tolist() else len(row) for row in new]
        return sum(lengths), seconds


def _mean_logprob(results) -> float:
    values = [lp for r in results for c in r.completions for lp in c.logprobs]
    return sum(values) / len(values)


def logprob_z(base_runs, spec_runs) -> float:
    """Two-sample z-score of the mean per-sequence logprob, speculation on vs off: exactness says both
    sample one distribution, so |z| stays small (|z| > 3 has odds ~1 in 370 by chance)."""
    def means(runs):
        return [statistics.mean(c.logprobs) for r in runs for c in r.completions if c.logprobs]
    a, b = means(spec_runs), means(base_runs)
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    se = (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5
    return (statistics.mean(a) - statistics.mean(b)) / se if se > 0 else 0.0


def length_ks_pvalue(base_runs, spec_runs) -> float:
    """Two-sample Kolmogorov-Smirnov p-value of the response lengths, speculation on vs off (exactness says
    one distribution; a length bias, from EOS or max_tokens handled wrongly mid-chain, shows here first)."""
    def lengths(runs):
        return [len(c.token_ids) for r in runs for c in r.completions]
    a, b = lengths(spec_runs), lengths(base_runs)
    return float(ks_2samp(a, b).pvalue) if a and b else float("nan")


@torch.inference_mode()
def measure_step_costs(model, batch: int, ks: list[int], context: int, reps: int = 7) -> dict:
    """Median ms of one target pass over `batch` rows of 1 and of k+1 new tokens each, at `context`
    cached tokens, variants alternating; -> {"decode_ms": T(B, 1), "verify_cost": {k: T(B, k+1) / T(B, 1)}}."""
    widths = [1] + [k + 1 for k in ks]
    cache = model.new_cache(batch, context + max(widths))
    ids = {w: torch.randint(0, model.cfg.vocab_size, (batch, w)) for w in widths}
    times = {w: [] for w in widths}
    for rep in range(reps + 1):
        for w in widths:
            cache.lens[:] = context
            start = time.perf_counter()
            model.forward(ids[w], cache)
            if rep:  # the first round warms up
                times[w].append(time.perf_counter() - start)
    decode = statistics.median(times[1])
    return {"decode_ms": decode * 1000,
            "verify_cost": {str(k): statistics.median(times[k + 1]) / decode for k in ks}}


DEFAULT_MAX_TOKENS = 128


def bench_inputs(model: str, count: int, seed: int, max_tokens: int | None, k: int) -> tuple[list[str], int]:
    """The bench's prompts and its response cap, checked against the model's context before any engine
    starts: `max_tokens` None takes DEFAULT_MAX_TOKENS or, for a short context, what fits beside the
    longest prompt and K drafts; a given `max_tokens` that does not fit is an error naming the numbers."""
    model_dir = resolve_checkpoint(model)
    tokenizer = load_tokenizer(model_dir)
    prompts = preset_prompts(model, tokenizer, count, seed)
    longest = max(len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts)
    context = load_config(model_dir).max_position_embeddings
    room = context - longest - k
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, room)
    if max_tokens > room or max_tokens < 1:
        raise ValueError(f"--max-tokens {max_tokens} does not fit {model}'s context: {longest} prompt tokens + "
                         f"max_tokens + K {k} must be <= {context} (at most {room} here)")
    return prompts, max_tokens


def ran_kernels(spec) -> dict:
    """`kernels_report` for the speculative backend: None for the kernels it did not run (the embedded engine's on
    vLLM; an int8 kernel where its draft holds no int8 weights), else the int8 kernel its draft ran."""
    report = kernels_report()
    engine = getattr(spec, "engine", None)
    head = getattr(getattr(getattr(engine, "proposer", None), "model", None), "lm_head", None)
    return {**report, "fp32_kernel": report["fp32_kernel"] if engine is not None else None,
            "int8_kernel": head.kernel if isinstance(head, Int8Projection) else None}


def run_rollout_bench(config: RolloutBenchConfig, progress=None) -> dict:
    config = dataclasses.replace(config, k=speculative_tokens(config.proposer, config.k))
    calls = -(-config.rows_per_round // config.batch)
    per_call = config.batch // config.n
    all_prompts, max_tokens = bench_inputs(config.model, calls * per_call, config.seed, config.max_tokens, config.k)
    chunks = [all_prompts[c * per_call:(c + 1) * per_call] for c in range(calls)]
    prompts = chunks[0]
    config = dataclasses.replace(config, max_tokens=max_tokens)
    common = dict(backend=config.backend, model=config.model, num_speculative_tokens=config.k, adaptive=config.adaptive,
                  compile=config.compile, prefix_caching=config.prefix_caching)
    spec_only = dict(fixed_tree_width=config.tree_width) if config.backend == "embedded" else {}
    base = make_backend(BackendConfig(proposer="none", **common))
    spec = make_backend(BackendConfig(proposer=config.proposer, draft=config.draft, verification=config.verification,
                                      **common, **spec_only))
    eager = make_backend(BackendConfig(proposer="none", **{**common, "compile": False})) \
        if config.eager_baseline and config.compile else None
    hf = HFGenerate(config.model, base.tokenizer) if config.hf else None

    greedy = SamplingParams(n=config.n, temperature=0, max_tokens=config.max_tokens, ignore_eos=config.ignore_eos)
    greedy_base, greedy_spec = base.generate(prompts, greedy), spec.generate(prompts, greedy)
    greedy_match = all(a.token_ids == b.token_ids for a, b in zip(greedy_base.completions, greedy_spec.completions))

    warm = SamplingParams(n=config.n, temperature=config.temperature, max_tokens=min(32, config.max_tokens),
                          seed=config.seed, ignore_eos=config.ignore_eos, drafter_invariant=config.drafter_invariant)
    spec.generate(prompts, warm)  # lets the planner explore before timing
    rates = {"base": [], "spec": [], "hf": [], "eager": []}
    runs = {"base": [], "spec": [], "eager": []}
    variants = (("base", base), ("spec", spec)) + ((("eager", eager),) if eager is not None else ())
    for r in range(config.rounds):
        # a seed per call: calls sharing one draw the same noise, so their samples are correlated and the
        # two-sample logprob_z, which takes them as independent, reads too wide
        params = [SamplingParams(n=config.n, temperature=config.temperature, max_tokens=config.max_tokens,
                                 seed=config.seed + 1 + r * calls + c, ignore_eos=config.ignore_eos,
                                 drafter_invariant=config.drafter_invariant)
                  for c in range(calls)]
        results = {name: [] for name, _ in variants}
        # call by call, each variant in turn: a few busy seconds of the machine slow one call of each variant,
        # not all of one variant's calls in the round
        for chunk, p in zip(chunks, params):
            for name, backend in variants:
                results[name].append(backend.generate(chunk, p))
        for name, done in results.items():
            runs[name] += done
            rates[name].append(sum(x.num_tokens for x in done) / sum(x.seconds for x in done))
        if hf is not None:
            timed = [hf.timed([p for p in chunk for _ in range(config.n)], call)
                     for chunk, call in zip(chunks, params)]
            rates["hf"].append(sum(t for t, _ in timed) / sum(s for _, s in timed))
        if progress is not None:
            progress(r + 1, config.rounds)

    stats = SpecStats()
    k_hist: dict[int, int] = {}
    widths: dict[int, int] = {}
    reasons: Counter = Counter()  # steps per planner reason (`planner.REASONS`)
    for result in runs["spec"]:
        stats.merge(result.spec)
        reasons.update(result.plan_reasons)
        for k, count in result.k_histogram.items():
            k_hist[k] = k_hist.get(k, 0) + count
        for w, count in result.width_histogram.items():
            widths[w] = widths.get(w, 0) + count
    base_rate, spec_rate = statistics.median(rates["base"]), statistics.median(rates["spec"])
    hf_rate = statistics.median(rates["hf"]) if rates["hf"] else None
    eager_rate = statistics.median(rates["eager"]) if rates["eager"] else None
    costs = step_cost_model(config, base, runs["spec"], stats, spec_rate / base_rate, all_prompts, max_tokens)
    return {
        "model": config.model, "proposer": config.proposer, "backend": config.backend, "batch": config.batch,
        "n": config.n, "verification": config.verification, "drafter_invariant": config.drafter_invariant,
        "k": config.k, "adaptive": config.adaptive, "temperature": config.temperature, "max_tokens": config.max_tokens,
        "rounds": config.rounds, "calls_per_round": calls,
        "rows_timed": sum(len(r.completions) for r in runs["spec"]), "threads": torch.get_num_threads(),
        **ran_kernels(spec),
        "tokens_per_s_base": base_rate, "tokens_per_s_spec": spec_rate, "speedup": spec_rate / base_rate,
        "speedup_per_round": [s / b for b, s in zip(rates["base"], rates["spec"])],
        "tokens_per_s_hf": hf_rate, "base_vs_hf": base_rate / hf_rate if hf_rate else None,
        "tokens_per_s_eager": eager_rate, "fast_vs_eager": base_rate / eager_rate if eager_rate else None,
        "acceptance_length": stats.acceptance_length, "acceptance_rate": stats.acceptance_rate,
        "acceptance_per_pos": stats.acceptance_per_pos, "k_histogram": dict(sorted(k_hist.items())),
        "plan_reasons": dict(sorted(reasons.items())),
        "tokens_per_verify_step": stats.acceptance_length, "width_histogram": dict(sorted(widths.items())),
        "draft_cost_share": sum(r.draft_seconds for r in runs["spec"]) / sum(r.seconds for r in runs["spec"]),
        "greedy_match": greedy_match,
        # the timed calls' responses, token for token the same on both sides (always, with drafter_invariant)
        "same_samples": all(a.token_ids == b.token_ids for x, y in zip(runs["base"], runs["spec"])
                            for a, b in zip(x.completions, y.completions)),
        "prompt_tokens_cached": {name: sum(r.cached_prompt_tokens for r in runs[name]) for name in ("base", "spec")},
        "mean_logprob_base": _mean_logprob(runs["base"]), "mean_logprob_spec": _mean_logprob(runs["spec"]),
        "logprob_z": logprob_z(runs["base"], runs["spec"]),
        "logprob_z_sequences": {name: sum(len(r.completions) for r in runs[name]) for name in ("base", "spec")},
        "length_ks_pvalue": length_ks_pvalue(runs["base"], runs["spec"]), **costs,
        "mean_response_tokens": statistics.mean(len(c.token_ids) for r in runs["base"] for c in r.completions),
        "mean_response_tokens_spec": statistics.mean(len(c.token_ids) for r in runs["spec"] for c in r.completions),
    }


def step_cost_model(config: RolloutBenchConfig, base, spec_runs, stats: SpecStats, speedup: float,
                    prompts: list[str], max_tokens: int) -> dict:
    """verify_cost, bound_speedup and achieved_over_bound (module docstring); None where the backend
    exposes no model to time (vLLM)."""
    model = getattr(getattr(base, "engine", None), "model", None)
    if model is None:
        return {"verify_cost": None, "decode_ms": None, "bound_speedup": None, "achieved_over_bound": None}
    prompt_len = max(len(base.tokenizer.encode(p, add_special_tokens=False)) for p in prompts)
    mix = Counter((k, width) for r in spec_runs for _, _, k, width in r.trace if k)  # speculative steps
    extras = sorted({*range(1, config.k + 1), *(width * k for k, width in mix)})  # a tree scores 1 + w k tokens
    measured = measure_step_costs(model, config.batch, extras, prompt_len + max_tokens // 2)
    if not mix:
        return {**measured, "bound_speedup": None, "achieved_over_bound": None}
    steps = sum(mix.values())
    verify = sum(n * measured["verify_cost"][str(width * k)] for (k, width), n in mix.items()) / steps
    draft_ms = 1000 * sum(r.draft_seconds for r in spec_runs) / steps
    decode = measured["decode_ms"]
    bound = stats.acceptance_length * decode / (verify * decode + draft_ms)
    return {**measured, "bound_step_mix": {f"k{k}w{width}": n for (k, width), n in sorted(mix.items())},
            "bound_verify_cost": verify, "draft_ms_per_step": draft_ms, "bound_speedup": bound,
            "achieved_over_bound": speedup / bound}


def report(summary: dict, config: RolloutBenchConfig, console) -> None:
    """The variants' tokens/s side by side, then acceptance and the exactness smoke checks."""
    table = Table(title=f"rollout: {config.model}, {config.proposer}, batch {config.batch}, T={config.temperature}")
    for column in ("variant", "tokens/s", "vs base"):
        table.add_column(column)
    base = summary["tokens_per_s_base"]
    table.add_row("base (no speculation)", f"{base:.1f}", "1.00x")
    table.add_row(f"speculative ({config.proposer})", f"{summary['tokens_per_s_spec']:.1f}", f"{summary['speedup']:.2f}x")
    if summary["tokens_per_s_hf"]:
        table.add_row("transformers generate", f"{summary['tokens_per_s_hf']:.1f}",
                      f"{summary['tokens_per_s_hf'] / base:.2f}x")
    console.print(table)
    console.print(f"acceptance length {summary['acceptance_length']:.2f}, rate {summary['acceptance_rate']:.2f}, "
                  f"per position {[round(a, 2) for a in summary['acceptance_per_pos']]}, "
                  f"K used {summary['k_histogram']}; greedy match {summary['greedy_match']}; "
                  f"mean logprob base {summary['mean_logprob_base']:.3f} spec {summary['mean_logprob_spec']:.3f}")


BENCH = Bench(RolloutBenchConfig, run_rollout_bench, report, steps=lambda c: c.rounds,
              help="rollout throughput, speculation off vs on, plus transformers generate",
              description="Runs the same reasoning prompts with speculation off and on, alternating, and reports "
                          "median tokens/s, acceptance and exactness checks.")
