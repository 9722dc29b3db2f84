"""Fault injection: `specrl train` killed with SIGKILL at random points and resumed, sync and async.

Chain of invariants:
    every resume                 continues from the newest complete checkpoint (its first record is
                                 that checkpoint's step + 1);
    a kill inside a checkpoint   leaves the previous checkpoints usable (writes are fsynced and swapped);
    the finished sync run        == the uninterrupted run, reward for reward, with the suffix proposer's
                                 memory restored from the checkpoints;
    sync and async               every step 1..N recorded once, no data position trained on twice.
The number of kills planned is SPECRL_FAULT_KILLS (default 3 sync, 2 async; a resumed run that finishes
first ends the test with fewer); each test prints one JSON line with what it tried (run with -s).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SMALL = ["--preset", "tiny", "rollout.prompts_per_step=4", "grpo.group_size=4", "rollout.max_tokens=12",
         "run.tensorboard=false", "optim.lr=1e-3", "backend.adaptive=false",
         "run.checkpoint_every=1", "run.threads=1"]


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def newest_checkpoint_step(run_dir: Path) -> int | None:
    done = [p for p in (run_dir / "checkpoints").glob("step_*") if (p / "state.json").is_file()]
    return max((int(p.name.split("_")[1]) for p in done), default=None)


def mid_write(run_dir: Path) -> bool:
    """A kill left a checkpoint write unfinished: a temporary folder or a copy set aside for a swap."""
    root = run_dir / "checkpoints"
    return any(root.glob(".tmp_step_*")) or any(root.glob(".step_*.old"))


def kill_and_resume(run_dir: Path, extra: list[str], steps: int, kills: int, seed: int) -> dict:
    """Run to `steps`, SIGKILLing the trainer `kills` times at a random moment 0-0.8 s after it records a new
    step (a step of this config takes ~0.3-1 s, its checkpoint write follows the record, so kills land in
    generation, training, and checkpoint writes), resuming each time from the newest checkpoint."""
    rng = random.Random(seed)
    tried = {"kills": 0, "kills_inside_checkpoint_writes": 0, "kills_elsewhere": 0, "resumes": 0,
             "resumes_from_newest_checkpoint": 0}
    while True:
        resume_from = newest_checkpoint_step(run_dir)
        if resume_from is None:
            command = ["train", *SMALL, *extra, f"run.steps={steps}", f"run.run_dir={run_dir}", "run.overwrite=true"]
        else:
            command = ["train", "--resume", str(run_dir)]
            tried["resumes"] += 1
        proc = subprocess.Popen([sys.executable, "-m", "specrl.cli", *command], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        seen = len(records(run_dir)) if resume_from is None else resume_from
        before = inode(run_dir / "metrics.jsonl")  # a resume rewrites the file (a new inode) to its checkpoint

        def new_record() -> bool:
            fresh = resume_from is None or inode(run_dir / "metrics.jsonl") != before
            return fresh and len(records(run_dir)) > seen

        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline and not new_record():
            time.sleep(0.01)
        if resume_from == steps:  # killed after its last checkpoint: the resume has nothing left to do
            tried["resumes_from_newest_checkpoint"] += proc.wait(timeout=300) == 0
        elif resume_from is not None and new_record():
            first_new = records(run_dir)[resume_from]["step"]
            tried["resumes_from_newest_checkpoint"] += first_new == resume_from + 1
        if tried["kills"] < kills and proc.poll() is None:
            time.sleep(rng.uniform(0.0, 0.8))
            os.kill(proc.pid, signal.SIGKILL)  # the trainer only; its Ray processes (async) are cleaned up below
            proc.wait()
            tried["kills"] += 1
            inside = mid_write(run_dir)
            tried["kills_inside_checkpoint_writes" if inside else "kills_elsewhere"] += 1
            os.killpg(proc.pid, signal.SIGKILL) if _group_alive(proc.pid) else None
            continue
        assert proc.wait(timeout=600) == 0
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        return tried


def inode(path: Path) -> int | None:
    return path.stat().st_ino if path.exists() else None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def kills_wanted(default: int) -> int:
    return int(os.environ.get("SPECRL_FAULT_KILLS", default))


def test_sync_runs_killed_anywhere_resume_to_the_uninterrupted_result(tmp_path):
    extra, steps = ["backend.proposer=suffix"], 12 + 8 * kills_wanted(3)
    reference = tmp_path / "reference"
    subprocess.run([sys.executable, "-m", "specrl.cli", "train", *SMALL, *extra, f"run.steps={steps}",
                    f"run.run_dir={reference}"], check=True, capture_output=True)
    killed = tmp_path / "killed"
    tried = kill_and_resume(killed, extra, steps, kills_wanted(3), seed=0)
    got, want = records(killed), records(reference)
    assert [r["step"] for r in got] == list(range(1, steps + 1))
    positions = [p for r in got for p in r["data_positions"]]
    assert positions == list(range(steps * 4))  # none lost, none repeated
    matched = sum(a["reward_mean"] == b["reward_mean"] and a["rollout_tokens"] == b["rollout_tokens"]
                  for a, b in zip(got, want))
    print(json.dumps({"pipeline": "sync", **tried, "steps": steps, "steps_matching_uninterrupted": matched}))
    assert tried["kills"] >= 1  # a resumed run may finish before every planned kill
    assert tried["resumes_from_newest_checkpoint"] == tried["resumes"]
    assert matched == steps


@pytest.mark.ray
def test_async_runs_with_the_trainer_killed_resume_without_losing_or_repeating_a_position(tmp_path):
    extra, steps = ["pipeline.mode=async", "pipeline.max_staleness=1", "backend.proposer=suffix"], \
        10 + 8 * kills_wanted(2)
    run_dir = tmp_path / "async"
    tried = kill_and_resume(run_dir, extra, steps, kills_wanted(2), seed=1)
    got = records(run_dir)
    assert [r["step"] for r in got] == list(range(1, steps + 1))
    positions = [p for r in got for p in r["data_positions"]]
    assert len(positions) == len(set(positions)) == steps * 4
    assert all(int(age) <= 1 for r in got for age in r["staleness_histogram"])
    print(json.dumps({"pipeline": "async", **tried, "steps": steps, "positions_trained": len(positions),
                      "positions_repeated": len(positions) - len(set(positions))}))
    assert tried["kills"] >= 1
    assert tried["resumes_from_newest_checkpoint"] == tried["resumes"]
