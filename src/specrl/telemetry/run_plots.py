"""Plots of a run folder's metrics.jsonl: reward, speculation acceptance, stage times (PNG)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specrl.telemetry.sinks import read_metrics  # noqa: E402


def running_mean(values: list[float], window: int) -> list[float]:
    """Each value's mean with the up to `window - 1` values before it."""
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
            for i in range(len(values))]


def plot_run(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    records = read_metrics(run_dir)
    if not records:
        raise ValueError(f"{run_dir}: metrics.jsonl has no steps yet")
    out_dir = Path(out_dir or Path(run_dir) / "plots")
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = [r["step"] for r in records]
    written = []

    fig, ax = plt.subplots(figsize=(6, 3.5))
    rewards = [r["reward_mean"] for r in records]
    ax.plot(steps, rewards, marker=".", alpha=0.35, label="per step")
    window = max(1, len(rewards) // 20)
    ax.plot(steps, running_mean(rewards, window), linewidth=2, label=f"mean of last {window} steps")
    ax.set_xlabel("step"), ax.set_ylabel("reward"), ax.set_title("reward"), ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / "reward.png"))

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    window = max(1, len(records) // 25)
    drafted = [r for r in records if r["spec"]["num_drafts"]]  # steps where K = 0 throughout drafted nothing
    plain = [r["step"] for r in records if not r["spec"]["num_drafts"]]
    if drafted:
        left.plot([r["step"] for r in drafted], [r["spec"]["acceptance_length"] for r in drafted], marker=".", ls="",
                  alpha=0.3, label="per step")
        left.plot([r["step"] for r in drafted], running_mean([r["spec"]["acceptance_length"] for r in drafted], window),
                  linewidth=2, label=f"mean of {window} drafting steps")
    if plain:  # a tick under the axis for each step that decoded plainly throughout
        left.plot(plain, [1.0] * len(plain), marker="|", ls="", color="grey", label=f"plain steps ({len(plain)})")
    left.set_xlabel("step"), left.set_ylabel("tokens per verify step"), left.set_title("acceptance length")
    left.grid(alpha=0.3), left.legend(fontsize=8)
    width = max(len(r["spec"]["num_accepted_tokens_per_pos"]) for r in records)
    for pos in range(width):
        rows = [r for r in drafted if pos < len(r["spec"]["num_accepted_tokens_per_pos"])]
        rates = [r["spec"]["num_accepted_tokens_per_pos"][pos] / r["spec"]["num_drafts"] for r in rows]
        right.plot([r["step"] for r in rows], running_mean(rates, window), label=f"position {pos}")
    right.set_xlabel("step"), right.set_ylabel(f"accepted share (mean of {window} drafting steps)"), right.grid(alpha=0.3)
    right.set_title("acceptance per draft position")
    if width:
        right.legend(fontsize=8)
    written.append(_save(fig, out_dir / "acceptance.png"))

    fig, ax = plt.subplots(figsize=(7, 3.5))
    stages = sorted({s for r in records for s in r["timing"]})
    bottom = [0.0] * len(records)
    for stage in stages:
        values = [r["timing"].get(stage, 0.0) for r in records]
        ax.bar(steps, values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("step"), ax.set_ylabel("seconds"), ax.set_title("stage times per step"), ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / "stage_times.png"))
    written += _eval_plot(records, out_dir) + _drain_plots(records, out_dir)
    return written


def _eval_plot(records: list[dict], out_dir: Path) -> list[Path]:
    """Held-out pass@1 against the policy version, with its 95% interval."""
    evals = [r[key] for r in records for key in ("eval_start", "eval") if key in r]
    if not evals:
        return []
    heads = "head_acceptance_adapted" in evals[0]
    fig, axes = plt.subplots(1, 2 if heads else 1, figsize=(11 if heads else 6, 3.5), squeeze=False)
    ax = axes[0][0]
    x = [e["policy_version"] for e in evals]
    y = [e["pass@1"] for e in evals]
    low = [e["pass@1"] - e["pass@1_ci95"][0] for e in evals]
    high = [e["pass@1_ci95"][1] - e["pass@1"] for e in evals]
    ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=3)
    ax.set_xlabel("policy version (step)"), ax.set_ylabel("pass@1"), ax.grid(alpha=0.3)
    ax.set_title(f"held-out pass@1 ({evals[0]['problems']} problems, 95% CI)")
    if heads:  # expected acceptance per draft position on the held-out rollouts: adapted vs frozen head
        right = axes[0][1]
        for depth in range(len(evals[0]["head_acceptance_adapted"])):
            line, = right.plot(x, [e["head_acceptance_adapted"][depth] for e in evals], marker="o",
                               label=f"position {depth} adapted")
            right.plot(x, [e["head_acceptance_frozen"][depth] for e in evals], marker="x", ls="--",
                       color=line.get_color(), label=f"position {depth} frozen")
        right.set_xlabel("policy version (step)"), right.set_ylabel("expected acceptance")
        right.set_title("head acceptance per position: adapted vs frozen"), right.grid(alpha=0.3)
        right.legend(fontsize=7)
    return [_save(fig, out_dir / "eval.png")]


def _drain_plots(records: list[dict], out_dir: Path) -> list[Path]:
    """The live rows and k over one representative generate call; and how often each k ran at each live batch
    size over the whole run."""
    traced = [r for r in records if r.get("drain")]
    if not traced:
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    # the representative step: among those that drafted at all, the one with the median number of engine steps
    drafting = [r for r in traced if any(e[2] for e in r["drain"])] or traced
    shown = sorted(drafting, key=lambda r: len(r["drain"]))[len(drafting) // 2]
    live, k = [e[1] for e in shown["drain"]], [e[2] for e in shown["drain"]]
    index = range(1, len(live) + 1)
    left.step(index, live, where="post", color="tab:blue", label="live rows")
    left.set_xlabel("engine step of the generate call"), left.set_ylabel("live rows", color="tab:blue")
    left.set_title(f"GRPO step {shown['step']}: the batch drains"), left.grid(alpha=0.3)
    drafts = left.twinx()
    drafts.step(index, k, where="post", color="tab:orange", label="k (drafts per row; 0 = plain)")
    drafts.set_ylabel("k", color="tab:orange"), drafts.set_ylim(-0.2, max(k) + 1.5)
    drafts.set_yticks(range(max(k) + 1))
    left.legend(handles=left.get_lines() + drafts.get_lines(), fontsize=8, loc="upper right")
    counts: dict[int, dict[int, int]] = {}  # live-batch bucket (power of 2) -> {k: engine steps}
    for r in traced:
        for _, live, k, _width in r["drain"]:
            bucket = live.bit_length() - 1
            counts.setdefault(bucket, {})[k] = counts.setdefault(bucket, {}).get(k, 0) + 1
    buckets = sorted(counts)
    ks = sorted({k for by_k in counts.values() for k in by_k})
    bottom = [0.0] * len(buckets)
    for k in ks:
        share = [counts[b].get(k, 0) / sum(counts[b].values()) for b in buckets]
        right.bar(range(len(buckets)), share, bottom=bottom, label=f"k={k}")
        bottom = [x + y for x, y in zip(bottom, share)]
    right.set_xticks(range(len(buckets)), [f"{2 ** b}-{2 ** (b + 1) - 1}" if b else "1" for b in buckets], fontsize=8)
    right.set_xlabel("live rows"), right.set_ylabel("share of engine steps"), right.set_title("k chosen against the live batch")
    right.legend(fontsize=8)
    return [_save(fig, out_dir / "drain.png")]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
