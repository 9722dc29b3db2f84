"""Write a model folder atomically: build it in a temporary sibling, then rename it into place."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def save_atomically(out: Path, write: Callable[[Path], object], record: dict) -> None:
    """`write(tmp)` fills a temporary folder, `record` goes to specrl_train.json, and the folder
    replaces `out` only once complete: a crash never leaves a half-written model behind."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        (tmp / "specrl_train.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
