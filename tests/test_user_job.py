"""A user's own RL job end to end: a JSONL file, a reward function file, `specrl train`, then `specrl eval`.

On the tiny model (its prompts are its own "Q:a+b\\nA:" format, sent raw with task.template=none):
every named reward is logged per step, a reward function that raises on some samples is counted
(and the run goes on), and `specrl eval RUN_DIR` scores the run's own held-out rows.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specrl.tasks.arithmetic import ArithmeticConfig, generate_problems


def test_a_users_dataset_and_reward_train_and_evaluate_from_the_command_line(tmp_path):
    problems = generate_problems(ArithmeticConfig(), 60, seed=1, split="train")
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": p.prompt, "answer": str(p.answer)}) + "\n" for p in problems))
    rewards = tmp_path / "my_reward.py"
    rewards.write_text("def odd_fails(response, example):\n"
                       "    if len(response) % 2:\n"
                       "        raise ValueError('odd length')\n"
                       "    return 1.0\n")
    run_dir = tmp_path / "run"
    common = [sys.executable, "-m", "specrl.cli"]
    train = subprocess.run(common + [
        "train", "--preset", "tiny", f"task.name=file", f"task.path={data}", "task.template=none",
        "task.eval_size=10", f'task.reward={{"numeric": 1, "{rewards}:odd_fails": 0.1}}', "run.steps=2",
        f"run.run_dir={run_dir}", "rollout.prompts_per_step=4", "grpo.group_size=4", "run.tensorboard=false",
        "eval.every=2", "eval.prompts=10"], capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-2000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        parts = record["rewards"]
        assert set(parts) == {"numeric", f"{rewards}:odd_fails"}
        assert record["reward_mean"] == pytest.approx(parts["numeric"] + 0.1 * parts[f"{rewards}:odd_fails"])
    errors = sum(r.get("reward_errors", {}).get(f"{rewards}:odd_fails", 0) for r in records)
    assert errors > 0 and "raised ValueError: odd length" in train.stderr
    assert records[-1]["eval"]["problems"] == 10
    evaluated = subprocess.run(common + ["eval", str(run_dir), "--threads", "1"],
                               capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert result["task"] == "file" and result["problems"] == 10 and 0.0 <= result["pass@1"] <= 1.0

