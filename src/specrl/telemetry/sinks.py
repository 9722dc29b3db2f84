"""Where per-step metrics go: `metrics.jsonl` (one JSON object per step) and TensorBoard."""
from __future__ import annotations

import json
from pathlib import Path


def flatten(record: dict, prefix: str = "") -> dict[str, float]:
    """Nested numeric dict -> {"a/b": value}; lists become a/0, a/1, ...; non-numbers are dropped."""
    out: dict[str, float] = {}
    for key, value in record.items():
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


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is this a specrl run folder?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Drop records after `last_step` (a resumed run re-does those steps; none is repeated)."""
    path = Path(run_dir) / "metrics.jsonl"
    if path.is_file():
        kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
        path.write_text("".join(line + "\n" for line in kept))
