"""Where specrl keeps what it builds and converts: $SPECRL_CACHE, else ~/.cache/specrl."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    env = os.environ.get("SPECRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specrl"
