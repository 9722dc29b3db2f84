"""PNG plots of the simulator's outputs (matplotlib, Agg backend).

  speedup_vs_batch.png   iteration-level speculation speedup vs live batch, one line per K
  step_breakdown.png     stage times: sync vs async x speculation off / on
  sensitivity_235b.png   235B step speedup vs acceptance, length tail and MoE layout
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_speedup_vs_batch(rows: list[dict], title: str, path: Path) -> Path:
    """One line per K through (batch, speedup) rows from projection.sweep."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in sorted({r["k"] for r in rows}):
        pts = sorted((r["batch"], r["speedup"]) for r in rows if r["k"] == k)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"K={k}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="live batch per replica", ylabel="speedup (tokens/s, spec / plain)", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_step_breakdown(cases: dict[str, dict], title: str, path: Path) -> Path:
    """Stacked bars of stage seconds; `cases` maps a label to a stage dict (projection._stages)."""
    stages = ["generation_s", "logprobs_s", "training_s", "weight_sync_s"]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(cases)
    for label_i, label in enumerate(labels):
        bottom = 0.0
        for j, st in enumerate(stages):
            v = cases[label][st]
            ax.bar(label_i, v, bottom=bottom, color=f"C{j}", label=st[:-2] if label_i == 0 else None)
            bottom += v
        ax.plot([label_i - 0.4, label_i + 0.4], [cases[label]["step_s"]] * 2, color="k", lw=2,
                label="step wall time" if label_i == 0 else None)
    ax.set_xticks(range(len(labels)), labels, rotation=15)
    ax.set(ylabel="seconds (stages are stacked; async overlaps them)", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sensitivity(sens: dict, target: float, title: str, path: Path) -> Path:
    """Three panels (acceptance, tail, layout): rollout and step speedup per setting, target line."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    for ax, (name, rows) in zip(axes, sens.items()):
        x = range(len(rows))
        ax.plot(x, [r[1] for r in rows], marker="o", label="rollout speedup (spec)")
        ax.plot(x, [r[2] for r in rows], marker="s", label="step speedup (spec)")
        ax.plot(x, [r[3] for r in rows], marker="^", label="vs sync, no spec")
        ax.axhline(target, color="red", ls="--", lw=1, label=f"seed projection {target}x")
        ax.set_xticks(list(x), [r[0] for r in rows], rotation=30, fontsize=8)
        ax.set_title(name)
    axes[0].set_ylabel("speedup")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
