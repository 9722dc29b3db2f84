"""Stage timers named after the pipeline's stages (generation, reward, training, ...)."""
from __future__ import annotations

import contextlib
import time


class StageTimer:
    """Accumulates wall seconds per stage; `lap()` returns and clears the current step's."""

    def __init__(self):
        self.step: dict[str, float] = {}
        self.total: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.step[name] = self.step.get(name, 0.0) + elapsed
            self.total[name] = self.total.get(name, 0.0) + elapsed

    def reassign(self, source: str, target: str, seconds: float) -> None:
        """Move `seconds` measured inside stage `source` to stage `target` (a nested stage)."""
        if seconds <= 0:
            return
        for book in (self.step, self.total):
            book[source] = book.get(source, 0.0) - seconds
            book[target] = book.get(target, 0.0) + seconds

    def lap(self) -> dict[str, float]:
        step, self.step = self.step, {}
        return step
