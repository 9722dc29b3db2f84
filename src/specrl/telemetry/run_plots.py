"""Plots of a run folder's metrics.jsonl: reward, speculation acceptance, stage times (PNG)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specrl.telemetry.sinks import read_metrics  # noqa: E402


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
    smooth = [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1])
              for i in range(len(rewards))]
    ax.plot(steps, smooth, linewidth=2, label=f"mean of last {window} steps")
    ax.set_xlabel("step"), ax.set_ylabel("reward"), ax.set_title("reward"), ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / "reward.png"))

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    drafted = [r for r in records if r["spec"]["num_drafts"]]  # steps where K = 0 throughout draw nothing
    left.plot([r["step"] for r in drafted], [r["spec"]["acceptance_length"] for r in drafted], marker=".", ls="")
    left.set_xlabel("step"), left.set_ylabel("tokens per verify step"), left.set_title("acceptance length")
    left.grid(alpha=0.3)
    width = max(len(r["spec"]["num_accepted_tokens_per_pos"]) for r in records)
    for pos in range(width):
        rates = [r["spec"]["num_accepted_tokens_per_pos"][pos] / r["spec"]["num_drafts"]
                 if r["spec"]["num_drafts"] and pos < len(r["spec"]["num_accepted_tokens_per_pos"]) else None
                 for r in records]
        right.plot(steps, rates, marker=".", label=f"position {pos}")
    right.set_xlabel("step"), right.set_title("acceptance per draft position"), right.grid(alpha=0.3)
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
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
