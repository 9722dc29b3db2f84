"""Every proposer on the same prompts: which draft pays where.

For each batch size, one round runs plain decoding, then every proposer (under each chain verification
rule asked for: block, token; the proposers' order rotating from round to round), then plain decoding again,
all on the same prompts with the same seed; rounds repeat and medians are reported (these machines are noisy).
Per proposer and batch: tokens/s, speedup over plain decoding (the median over rounds of the proposer's rate
over the round's plain rate, which is over the mean time of the two plain calls: a drift of the machine's
speed between rounds, or steadily within one, cancels), acceptance length and per-position acceptance (vLLM's
definitions), the share of wall time spent inside the proposer, the K the planner ran and why (its steps per
reason, `REASONS`); and the kernels the models ran, with the CPU flags that chose them (`kernels_report`). The
two plain calls of a round do the same work, so how far they differ (`plain_spread`, the median over rounds) is
the noise a cell is read against. At temperature 1 the variants sample other responses from the same seed,
whose lengths decide how a batch drains; `drafter_invariant` has every variant sample the same ones
(`same_samples`), so a cell compares speed alone.

Rows of a batch are prompts x n: rows of one prompt are a GRPO group, which the suffix
and hybrid proposers draft from. A proposer whose checkpoint is missing is skipped and
named in `skipped` with the command that makes it.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from rich.table import Table

from specrl.backends import BackendConfig, make_backend
from specrl.bench import Bench
from specrl.bench.rollout_bench import bench_inputs
from specrl.models.llama import kernels_report
from specrl.sampling import SamplingParams
from specrl.speculation.proposer_registry import MODEL_DRAFTS, PROPOSER_NAMES, speculative_tokens
from specrl.telemetry.spec_stats import SpecStats
from specrl.validation import check_fields, choices, within


@dataclass(frozen=True)
class DraftersBenchConfig:
    """One comparison: a model, the proposers, the batch sizes."""

    SECTION: ClassVar[str] = "bench drafters"

    model: str = "tiny"  # tiny | smollm2-135m | a checkpoint directory
    proposers: tuple[str, ...] = PROPOSER_NAMES  # which proposers to run
    batches: tuple[int, ...] = (1, 4, 16)  # rows per call
    n: int = within(4, "[1, inf)")  # samples per prompt (capped at the batch): the group siblings draft from
    k: int | None = within(None, "[0, inf)", alias="K")  # num_speculative_tokens; None = each proposer's default
    adaptive: bool = True  # let the engine choose K per step (0 = off)
    hybrid_model: Literal[MODEL_DRAFTS] = "eagle3"  # type: ignore[valid-type]  # the model-draft half of the hybrid
    max_tokens: int | None = within(None, "[1, inf)")  # response cap; None = 128, or what fits the model's context
    temperature: float = within(1.0, "[0, inf)")
    rounds: int = within(3, "[1, inf)")  # timed rounds per batch size; medians are reported
    seed: int = 0  # call i of a round uses seed + i on every variant
    # every variant draws with noise keyed by each token's place (`SamplingParams.drafter_invariant`): all sample
    # the same responses, so a cell compares speed alone, at that rule's acceptance (`same_samples`)
    drafter_invariant: bool = False
    plot: str | None = "drafters.png"  # speedup vs batch, one line per proposer; None = no plot
    # the chain verification rules to run each proposer under (block, token), side by side in every round
    verifications: tuple[str, ...] = ("block",)
    threads: int | None = within(None, "[1, inf)")  # torch CPU threads; None = all cores

    def __post_init__(self):
        check_fields(self)
        unknown = [p for p in self.proposers if p not in PROPOSER_NAMES]
        if unknown:
            raise ValueError(f"unknown proposers {unknown}; choose from {PROPOSER_NAMES}")
        if not self.proposers or not self.batches or min(self.batches) < 1:
            raise ValueError("proposers and batches must be non-empty and batches >= 1")
        rules = choices(BackendConfig, "verification")
        if not self.verifications or any(v not in rules for v in self.verifications):
            raise ValueError(f"verifications must be a non-empty subset of {list(rules)}, got {list(self.verifications)}")


@dataclass
class _Runs:
    rates: list[float] = field(default_factory=list)
    spec: SpecStats = field(default_factory=SpecStats)
    seconds: float = 0.0
    draft_seconds: float = 0.0
    k_histogram: Counter = field(default_factory=Counter)  # steps per k
    plan_reasons: Counter = field(default_factory=Counter)  # steps per reason the planner gave (`REASONS`)
    tokens: list[list[int]] = field(default_factory=list)  # every sampled response, in call order

    def add(self, result) -> None:
        self.rates.append(result.num_tokens / result.seconds)
        self.tokens += [c.token_ids for c in result.completions]
        self.spec.merge(result.spec)
        self.seconds += result.seconds
        self.draft_seconds += result.draft_seconds
        self.k_histogram.update(result.k_histogram)
        self.plan_reasons.update(result.plan_reasons)


def _backends(config: DraftersBenchConfig) -> tuple[dict, dict[str, str]]:
    """(proposer, verification) -> backend, the baseline as ("none", None); and the proposers skipped, with why."""
    backends, skipped = {}, {}
    common = dict(model=config.model, num_speculative_tokens=config.k, adaptive=config.adaptive,
                  hybrid_model=config.hybrid_model)
    backends["none", None] = make_backend(BackendConfig(**common))
    for name in config.proposers:
        for rule in config.verifications:
            try:
                backends[name, rule] = make_backend(BackendConfig(proposer=name, verification=rule, **common))
            except FileNotFoundError as err:  # an untrained draft: say which, and how to make it
                skipped[name] = str(err)
                break
    return backends, skipped


def run_drafters_bench(config: DraftersBenchConfig, progress=None) -> dict:
    inputs, caps = {}, []  # batch -> (prompts, n); checked against the model's context before any engine starts
    for batch in config.batches:
        n = min(config.n, batch)
        if batch % n:
            raise ValueError(f"batch {batch} must be a multiple of n {n} (batch = prompts x n)")
        most_k = max(speculative_tokens(p, config.k) for p in config.proposers)
        prompts, max_tokens = bench_inputs(config.model, batch // n, config.seed, config.max_tokens, most_k)
        inputs[batch] = prompts, n
        caps.append(max_tokens)
    config = dataclasses.replace(config, max_tokens=min(caps))
    backends, skipped = _backends(config)
    drafted = [key for key in backends if key[0] != "none"]
    rows, spread, done, total = [], {}, 0, len(config.batches) * config.rounds
    for batch, (prompts, n) in inputs.items() if drafted else ():  # (every proposer skipped: nothing to time)
        warm = SamplingParams(n=n, temperature=config.temperature, max_tokens=min(32, config.max_tokens),
                              seed=config.seed, drafter_invariant=config.drafter_invariant)
        for key in drafted:
            backends[key].generate(prompts, warm)  # adaptive K explores before timing
        runs = {key: _Runs() for key in drafted}
        plain, plain_after = _Runs(), _Runs()  # each round's first and last call
        for r in range(config.rounds):
            params = SamplingParams(n=n, temperature=config.temperature, max_tokens=config.max_tokens,
                                    seed=config.seed + 1 + r, drafter_invariant=config.drafter_invariant)
            plain.add(backends["none", None].generate(prompts, params))
            turn = r % len(drafted)  # each proposer takes each place in the round in turn
            for key in drafted[turn:] + drafted[:turn]:
                runs[key].add(backends[key].generate(prompts, params))
            plain_after.add(backends["none", None].generate(prompts, params))
            done += 1
            if progress is not None:
                progress(done, total)
        # both plain calls did the same work: the round's plain rate is over their mean time, and how far the
        # second strays from the first is the machine's noise on one call
        base = [2 / (1 / first + 1 / last) for first, last in zip(plain.rates, plain_after.rates)]
        spread[batch] = statistics.median(abs(last / first - 1) for first, last in zip(plain.rates, plain_after.rates))
        for (name, rule), run in runs.items():
            ratios = [ours / theirs for ours, theirs in zip(run.rates, base)]  # each round's, paired
            rows.append({
                "proposer": name, "verification": rule, "batch": batch, "n": n,
                "tokens_per_s": statistics.median(run.rates), "tokens_per_s_base": statistics.median(base),
                "speedup": statistics.median(ratios), "speedup_rounds": ratios,
                "acceptance_length": run.spec.acceptance_length,
                "acceptance_per_pos": run.spec.acceptance_per_pos, "draft_cost_share": run.draft_seconds / run.seconds,
                "k_histogram": dict(sorted(run.k_histogram.items())),
                "plan_reasons": dict(sorted(run.plan_reasons.items())),
                "same_samples": run.tokens == plain.tokens,  # as the plain calls', token for token
            })
    best = max(rows, key=lambda row: row["speedup"]) if rows else None
    summary = {
        "model": config.model, "k": config.k, "adaptive": config.adaptive, "temperature": config.temperature,
        "verifications": list(config.verifications), "drafter_invariant": config.drafter_invariant,
        "max_tokens": config.max_tokens, "rounds": config.rounds, "rows": rows, "plain_spread": spread,
        "skipped": skipped, **kernels_report(),
        "best": {"proposer": best["proposer"], "batch": best["batch"], "speedup": best["speedup"]} if best else None,
    }
    if config.plot and rows:
        summary["plot"] = str(plot_speedups(rows, Path(config.plot), config))
    return summary


def plot_speedups(rows: list[dict], path: Path, config: DraftersBenchConfig) -> Path:
    """Speedup over plain decoding against batch size, one line per proposer (log-2 batch axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, rule in dict.fromkeys((row["proposer"], row["verification"]) for row in rows):
        mine = [row for row in rows if (row["proposer"], row["verification"]) == (name, rule)]
        label = name if len(config.verifications) == 1 else f"{name} ({rule})"
        ax.plot([row["batch"] for row in mine], [row["speedup"] for row in mine], marker="o", label=label)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (rows = prompts x n)")
    ax.set_ylabel("rollout speedup vs no speculation")
    mode = "adaptive K" if config.adaptive else f"K={config.k}"
    ax.set_title(f"{config.model}, T={config.temperature:g}, {mode}, max K {'per proposer' if config.k is None else config.k}")
    ax.legend()
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(summary: dict, config: DraftersBenchConfig, console) -> None:
    """One row per proposer, verification rule and batch; the kernels; the proposers skipped and why; the plot's
    path."""
    table = Table(title=f"drafters: {config.model}, T={config.temperature}, "
                        f"{'adaptive K' if config.adaptive else 'K'} <= {'per proposer' if config.k is None else config.k}")
    for column in ("proposer", "verify", "batch", "tokens/s", "speedup", "accept len", "accept per pos", "draft cost",
                   "K used"):
        table.add_column(column)
    for row in summary["rows"]:
        table.add_row(row["proposer"], row["verification"], str(row["batch"]), f"{row['tokens_per_s']:.1f}",
                      f"{row['speedup']:.2f}x", f"{row['acceptance_length']:.2f}",
                      " ".join(f"{a:.2f}" for a in row["acceptance_per_pos"]), f"{100 * row['draft_cost_share']:.0f}%",
                      str(row["k_histogram"]))
    console.print(table)
    for batch, spread in summary["plain_spread"].items():
        console.print(f"batch {batch}: a round's two plain calls differ by {100 * spread:.1f}% (median): the "
                      "noise each speedup is read against")
    console.print(f"kernels: fp32 {summary['fp32_kernel']}, int8 {summary['int8_kernel']} (CPU class "
                  f"{summary['cpu_class']}; $SPECRL_FP32_KERNEL and $SPECRL_INT8_KERNEL pin them where set)")
    for name, reason in summary["skipped"].items():
        console.print(f"skipped {name}: {reason}")
    if summary.get("plot"):
        console.print(f"plot: {summary['plot']}")


BENCH = Bench(DraftersBenchConfig, run_drafters_bench, report, steps=lambda c: len(c.batches) * c.rounds,
              help="every proposer on the same prompts: a table and a speedup-vs-batch plot",
              description="For each batch size, runs plain decoding, every proposer (n-gram, group suffix, draft "
                          "model, EAGLE-3 head, MTP head, int8 self-draft, hybrid) and plain decoding again on the "
                          "same prompts and seeds, for --rounds rounds. Prints acceptance length, acceptance per "
                          "position, median speedup over the round's plain calls, the proposer's share of wall time "
                          "and how far the two plain calls differ (the noise floor); writes a PNG of speedup against "
                          "batch size. Proposers whose checkpoint is missing are skipped and named.")
