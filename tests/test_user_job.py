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
        "train", "--preset", "tiny", "task.name=file", f"task.path={data}", "task.template=none",
        "task.eval_size=10", f'task.reward={{"numeric": 1, "{rewards}:odd_fails": 0.1}}', "run.steps=2",
        f"run.run_dir={run_dir}", "rollout.prompts_per_step=4", "grpo.group_size=4", "run.tensorboard=false",
        "eval.every=2", "eval.prompts=10"], capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-2000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        parts = record["rewards"]
        assert set(parts) == {"numeric", "my_reward.py:odd_fails"}
        assert record["reward_mean"] == pytest.approx(parts["numeric"] + 0.1 * parts["my_reward.py:odd_fails"])
    errors = sum(r.get("reward_errors", {}).get("my_reward.py:odd_fails", 0) for r in records)
    assert errors > 0 and "raised ValueError: odd length" in train.stderr
    assert records[-1]["eval"]["problems"] == 10
    evaluated = subprocess.run(common + ["eval", str(run_dir), "--threads", "1"],
                               capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert result["task"] == "file" and result["problems"] == 10 and 0.0 <= result["pass@1"] <= 1.0
    job = tmp_path / "job.json"  # the untrained model on the same held-out rows, from the job's config file
    job.write_text(json.dumps({"task": {"name": "file", "path": str(data), "template": "none", "eval_size": 10,
                                        "reward": "numeric"}}))
    before = subprocess.run(common + ["eval", "tiny", "--config", str(job), "--threads", "1"],
                            capture_output=True, text=True, timeout=600, check=True)
    assert json.loads(before.stdout.strip().splitlines()[-1])["problems"] == 10



@pytest.mark.parametrize("proposer", ["int8", "ngram", "suffix"])
def test_a_qwen3_checkpoint_folder_trains_on_a_users_dataset_with_its_chat_template(tmp_path, proposer):
    """A random Qwen3 checkpoint the test writes, with a chat-template tokenizer: GRPO with each draft that
    needs no training, the engine's logprobs equal to the trainer's, prompts rendered through the template."""
    from helpers import save_chat_tokenizer, save_random_checkpoint
    from specrl.pipeline.config import load_config
    from specrl.pipeline.loop import Pipeline

    model = tmp_path / "qwen3"
    save_random_checkpoint(model, arch="qwen3", vocab=100)
    tokenizer = save_chat_tokenizer(model)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}=?", "answer": str(2 * i)}) + "\n" for i in range(40)))
    config = load_config(overrides=[
        f"backend.model={model}", f"backend.proposer={proposer}", "task.name=file", f"task.path={data}",
        "task.eval_size=8", "task.system_prompt=Add.", "rollout.max_tokens=8", "rollout.prompts_per_step=2",
        "grpo.group_size=4", "run.steps=2", f"run.run_dir={tmp_path / 'run'}", "run.tensorboard=false",
        "eval.every=2", "eval.prompts=8", "run.threads=2"])
    pipeline = Pipeline(config)
    summary = pipeline.run()
    assert summary["steps_run"] == 2 and summary["eval_pass@1_last"] is not None
    for record in pipeline.history:
        assert record["train"]["logprob_abs_error_max"] < 1e-4
    prompt = pipeline.learner.task.render(pipeline.learner.task[0], tokenizer)
    assert prompt.startswith("<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n0+0=?")


def test_a_head_trained_for_a_qwen3_checkpoint_folder_drafts_its_grpo_rollouts(tmp_path):
    """`specrl train-draft --kind eagle3 --target PATH`, then GRPO on a user's dataset with that head."""
    from helpers import save_chat_tokenizer, save_random_checkpoint
    from specrl.pipeline.config import load_config
    from specrl.pipeline.loop import Pipeline

    model, head = tmp_path / "qwen3", tmp_path / "head"
    save_random_checkpoint(model, arch="qwen3", vocab=100)
    save_chat_tokenizer(model)
    subprocess.run([sys.executable, "-m", "specrl.cli", "train-draft", "--kind", "eagle3", "--target", str(model),
                    "--out", str(head), "--prompts", "8", "--held-out-prompts", "2", "--max-new-tokens", "8",
                    "--steps", "5", "--sample-batch", "4"], check=True, capture_output=True, timeout=600)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=?", "answer": str(2 * i)}) + "\n" for i in range(20)))
    pipeline = Pipeline(load_config(overrides=[
        f"backend.model={model}", "backend.proposer=eagle3", f"backend.draft={head}", "task.name=file",
        f"task.path={data}", "task.eval_size=4", "rollout.max_tokens=8", "rollout.prompts_per_step=2",
        "grpo.group_size=4", "run.steps=1", f"run.run_dir={tmp_path / 'run'}", "run.tensorboard=false"]))
    summary = pipeline.run()
    assert summary["acceptance_length"] > 1.0
    assert pipeline.history[0]["train"]["logprob_abs_error_max"] < 1e-4
