"""One `specrl train` run as a subprocess, for the benchmarks that compare whole GRPO runs."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def run_train(preset: str, steps: int, run_dir: Path, extra: list[str], threads: int | None = None) -> dict:
    """`specrl train --preset PRESET run.steps=STEPS` in `run_dir` with the `key=value` overrides `extra` (no
    checkpoints, no tensorboard; torch's threads set to `threads` where given) -> its closing JSON line
    (`summary`), the process's wall seconds (`wall_s`), the loop's own seconds less the async actors' start-up
    (`loop_s`) and the reward of each step (`rewards`)."""
    command = [sys.executable, "-m", "specrl.cli", "train", "--preset", preset, f"run.steps={steps}",
               f"run.run_dir={run_dir}", "run.overwrite=true", "run.tensorboard=false", "run.checkpoint_every=0",
               *([f"run.threads={threads}"] if threads else []), *extra]
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(f"`{' '.join(command[1:])}` failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    rewards = [json.loads(line)["reward_mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    loop = summary["seconds"] - summary["timing"].get("actor_startup", 0.0)
    return {"wall_s": wall, "loop_s": loop, "rewards": rewards, "summary": summary}
