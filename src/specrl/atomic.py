"""Durable writes: a file or folder is replaced only by a complete, fsynced copy, and one copy
of it exists at every instant, whenever the process is killed.

    write_text_atomically(path, text)   temp file in the same folder -> fsync -> os.replace
    replace_folder(tmp, final)          fsync tmp's files and folders; final -> .final.old (kept);
                                        tmp -> final; fsync the parent; delete .final.old
    recover_folder(final)               after a kill between those two renames, .final.old is the
                                        only copy: rename it back

A folder cannot be renamed over a non-empty one, so a folder swap takes two renames; the
`.old` copy bridges the gap and every reader calls `recover_folder` first.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file below `folder`, then every folder (children before parents)."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            _fsync(Path(root) / name)
        _fsync(Path(root))


def write_text_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text`: readers see the old content or the new, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def old_copy(final: Path) -> Path:
    """Where `replace_folder` keeps the previous copy of `final` while it swaps (hidden from globs)."""
    return final.parent / f".{final.name}.old"


def recover_folder(final: Path) -> None:
    """Finish a swap that a kill interrupted: restore the kept copy if `final` is missing, else drop it."""
    final, old = Path(final), old_copy(Path(final))
    if old.exists():
        if final.exists():
            shutil.rmtree(old)
        else:
            old.rename(final)


def replace_folder(tmp: Path, final: Path) -> None:
    """Move the complete folder `tmp` to `final`, replacing any earlier copy (see the module docstring)."""
    tmp, final = Path(tmp), Path(final)
    recover_folder(final)
    fsync_tree(tmp)
    old = old_copy(final)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    _fsync(final.parent)
    if old.exists():
        shutil.rmtree(old)
