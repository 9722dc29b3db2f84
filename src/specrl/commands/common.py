"""Small pieces every subcommand shares: thread count and a progress bar."""
from __future__ import annotations

import contextlib
import os

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


def add_threads_flag(parser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: all cores of this machine)")


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count on purpose; returns it."""
    count = threads or os.cpu_count() or 1
    if count < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(count)
    return count


@contextlib.contextmanager
def progress_bar(description: str, total: int):
    """Yields update(done, total); draws on stderr so stdout keeps its one JSON line."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda done, _total=total: progress.update(task, completed=done)
