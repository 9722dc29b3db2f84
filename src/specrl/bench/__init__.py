"""Benchmarks: each module holds one, described by its `BENCH` (a `Bench`); each ends with one JSON line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Bench:
    """What `specrl bench NAME` runs. Its flags, `--config FILE` and `key=value` overrides are made from the
    fields of `config` (a config class with a `threads` field); `run(config, progress)` returns the summary that
    becomes the command's JSON line; `report(summary, config, console)` prints it for a reader; `steps(config)`
    is the progress bar's length, in the calls `run` makes to `progress(done)`."""
    config: type
    run: Callable[..., dict]
    report: Callable[[dict, Any, Any], None]
    steps: Callable[[Any], int]
    help: str  # one line, for `specrl bench --help`
    description: str  # for `specrl bench NAME --help`
