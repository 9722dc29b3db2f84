"""Where per-step metrics go: `metrics.jsonl` (one JSON object per step) and TensorBoard."""
from __future__ import annotations

import json
from pathlib import Path

from specrl.atomic import write_text_atomically


NOT_SCALARS = {"drain", "data_positions"}  # per-step series kept in metrics.jsonl (for plots), not TensorBoard scalars


def flatten(record: dict, prefix: str = "") -> dict[str, float]:
    """Nested numeric dict -> {"a/b": value}; lists become a/0, a/1, ...; non-numbers and the
    top-level series in NOT_SCALARS are dropped."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if not prefix and key in NOT_SCALARS:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        elif isinstance(value, (list, tuple)):
            out.update(flatten({str(i): v for i, v in enumerate(value)}, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


class MetricsSink:
    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, step: int, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for name, value in flatten(record).items():
                self.writer.add_scalar(name, value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _records(path: Path) -> list[dict]:
    """The complete records of a metrics.jsonl. Each record is written as one line ending in a newline;
    a last line without one was cut by a kill mid-write and is not a record."""
    text = path.read_text()
    lines = text.split("\n")
    complete = lines[:-1]  # the text after the last newline is "" or a cut record
    return [json.loads(line) for line in complete if line.strip()]


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is this a specrl run folder?)")
    return _records(path)


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Keep the records up to `last_step` (a resumed run re-does the later steps; none is repeated)."""
    path = Path(run_dir) / "metrics.jsonl"
    if path.is_file():
        kept = [record for record in _records(path) if record["step"] <= last_step]
        write_text_atomically(path, "".join(json.dumps(record) + "\n" for record in kept))
