"""A user's dataset and rewards as a task (`task.name=file`).

    formats      JSONL, JSON, CSV, Parquet and a save_to_disk folder give the same problems
    fields       prompt falls back to question; a prompt may be chat messages; fields are named by config
    held out     the last task.eval_size rows, or task.eval_path's; training never draws them
    rendering    the tokenizer's chat template with task.system_prompt and task.instruction; template=none is raw
    rewards      verifiers by name, user functions (module or file), weights, per-reward parts
    failures     a raising function scores 0 and is reported; a non-finite return is an error naming it
    bad input    a missing file or field, an empty dataset, an unknown verifier, a function that cannot be
                 imported or has the wrong signature: each an error at load that names it
"""
from __future__ import annotations

import json
import math

import pytest

from helpers import save_chat_tokenizer
from specrl.tasks import TaskConfig, make_task

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(30)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def file_task(path, **kwargs):
    return make_task(TaskConfig(name="file", path=str(path), **{"eval_size": 5, **kwargs}))


def test_every_file_format_gives_the_same_problems(tmp_path):
    import datasets

    data = datasets.Dataset.from_list(ROWS)
    paths = [write_jsonl(tmp_path / "d.jsonl", ROWS), tmp_path / "d.json", tmp_path / "d.csv",
             tmp_path / "d.parquet", tmp_path / "saved"]
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    data.to_csv(str(tmp_path / "d.csv"), index=False)
    data.to_parquet(str(tmp_path / "d.parquet"))
    data.save_to_disk(str(tmp_path / "saved"))
    tasks = [file_task(p) for p in paths]
    for task in tasks:
        assert len(task) == 25 and [p.example["question"] for p in task.held_out(5)] == \
            [r["question"] for r in ROWS[25:]]
        assert task.reward("\\boxed{8}", task[4]) == 1.0 and task.reward("9", task[4]) == 0.0


def test_held_out_rows_are_never_drawn_for_training(tmp_path):
    task = file_task(write_jsonl(tmp_path / "d.jsonl", ROWS))
    trained = {task[i].index for i in range(200)}
    assert trained == set(range(25)) and {p.index for p in task.held_out(5)} == set(range(25, 30))
    with pytest.raises(ValueError, match="eval.prompts \\(6\\) is more than the 5 held-out problems"):
        task.held_out(6)
    held = write_jsonl(tmp_path / "held.jsonl", ROWS[:3])
    separate = file_task(tmp_path / "d.jsonl", eval_path=str(held))
    assert len(separate) == 30 and [p.example for p in separate.held_out(3)] == ROWS[:3]


def test_prompts_render_through_the_chat_template_with_system_prompt_and_instruction(tmp_path):
    tokenizer = save_chat_tokenizer(tmp_path / "tok")
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    task = file_task(path, system_prompt="Be brief.", instruction="Put the answer in \\boxed{}.")
    assert task.render(task[1], tokenizer) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                               "What is 1 + 1?\nPut the answer in \\boxed{}.<|im_end|>\n"
                                               "<|im_start|>assistant\n")
    raw = file_task(path, template="none", instruction="Answer:")
    assert raw.render(raw[1], tokenizer) == "What is 1 + 1?\nAnswer:\n"


def test_a_prompt_may_be_chat_messages_and_fields_are_named_by_config(tmp_path):
    tokenizer = save_chat_tokenizer(tmp_path / "tok")
    rows = [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": f"q{i}"}], "gold": "B"}
            for i in range(8)]
    task = file_task(write_jsonl(tmp_path / "d.jsonl", rows), eval_size=2, prompt_field="messages",
                     answer_field="gold", reward="choice", instruction="Pick one.")
    assert task.render(task[0], tokenizer) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq0\nPick one."
                                               "<|im_end|>\n<|im_start|>assistant\n")
    assert task.reward("The answer is (B)", task[0]) == 1.0


def test_weighted_rewards_sum_and_each_part_is_kept(tmp_path):
    module = tmp_path / "my_rewards.py"
    module.write_text("def short(response, example):\n    return 1.0 if len(response) < 10 else 0.0\n")
    task = file_task(write_jsonl(tmp_path / "d.jsonl", ROWS), reward={"math": 1.0, f"{module}:short": 0.25})
    score = task.score("\\boxed{4}", task[2])
    assert score.reward == 1.25 and score.parts == {"math": 1.0, "my_rewards.py:short": 1.0} and score.error is None
    assert task.score("a long answer of 5", task[2]).reward == 0.0


def test_file_paths_are_kept_absolute_so_a_run_finds_them_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = TaskConfig(name="file", path="d.jsonl", reward={"math": 1, "r.py:f": 0.5})
    assert config.path == str(tmp_path / "d.jsonl") and config.reward == {"math": 1, f"{tmp_path}/r.py:f": 0.5}


def test_a_reward_function_by_module_name_receives_the_row(tmp_path, monkeypatch):
    (tmp_path / "level_reward.py").write_text("def by_level(response, example):\n    return example['level']\n")
    monkeypatch.chdir(tmp_path)
    task = file_task(write_jsonl(tmp_path / "d.jsonl", ROWS), reward="level_reward:by_level")
    assert [task.reward("", task[i]) for i in range(3)] == [0.0, 1.0, 2.0]


def test_a_raising_reward_scores_zero_with_its_reason_and_a_non_finite_one_is_an_error(tmp_path):
    module = tmp_path / "flaky.py"
    module.write_text("def flaky(response, example):\n    return 1 / len(response)\n"
                      "def bad(response, example):\n    return float('nan')\n"
                      "def text(response, example):\n    return 'yes'\n")
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    task = file_task(path, reward={"math": 1, f"{module}:flaky": 1})
    score = task.score("", task[0])
    assert score.parts["flaky.py:flaky"] == 0.0 and score.error == ("flaky.py:flaky",
                                                                     "ZeroDivisionError: division by zero")
    assert task.score("ab", task[0]).reward == 0.5
    for name, shown in (("bad", "nan"), ("text", "'yes'")):
        task = file_task(path, reward=f"{module}:{name}")
        with pytest.raises(ValueError, match=f"task.reward 'flaky.py:{name}' returned {shown}, not a finite number, for "
                                             "the response 'x' to the example .*What is 0"):
            task.score("x", task[0])


@pytest.mark.parametrize("setup, message", [
    (lambda d: {"path": str(d / "missing.jsonl")}, "task.path: no file or folder .*missing.jsonl"),
    (lambda d: {"path": str(write_jsonl(d / "e.jsonl", []))}, "task.path: .*e.jsonl holds no rows"),
    (lambda d: {"path": str(write_jsonl(d / "d.txt", ROWS))}, "d.txt is not a dataset file"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "prompt_field": "problem"},
     "row 0: no prompt field 'problem'; its fields are \\['answer', 'level', 'question'\\]"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", [{"text": "q", "answer": "1"}] * 9))},
     "no prompt field 'question' \\(the default is 'prompt', else 'question'\\)"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "answer_field": "solution"},
     "row 0: no answer field 'solution' \\(the verifiers \\['math'\\] read it\\)"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", [{"prompt": 3, "answer": "1"}] * 9))},
     "row 0: the prompt must be text or a non-empty list"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "reward": "regex"}, "unknown verifier 'regex'"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "reward": "task"}, "no verifier of its own"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "reward": "no_such_module_x:f"},
     "importing no_such_module_x failed: ModuleNotFoundError"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "reward": "math:sqrt"}, "its signature is sqrt"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "reward": "json:no_such_function"},
     "json has no function 'no_such_function'"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "reward": {"math": "high"}},
     "the weight of 'math' must be a finite number"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS)), "reward": "choice"}, "row 0: the gold answer '0' "
                                                                                     "is not a choice letter"),
    (lambda d: {"path": str(write_jsonl(d / "d.jsonl", ROWS[:5]))}, "has 5 rows, not more than task.eval_size"),
])
def test_bad_input_is_an_error_at_load_that_names_it(tmp_path, setup, message):
    with pytest.raises(ValueError, match=message):
        make_task(TaskConfig(name="file", **{"eval_size": 5, **setup(tmp_path)}))


def test_the_file_task_needs_a_path_and_other_tasks_refuse_one():
    with pytest.raises(ValueError, match="task.name=file needs task.path"):
        TaskConfig(name="file")
    with pytest.raises(ValueError, match="task.path names the dataset file of task.name=file"):
        TaskConfig(name="arithmetic", path="x.jsonl")


def test_built_in_tasks_take_extra_rewards_by_weight(tmp_path):
    module = tmp_path / "fmt.py"
    module.write_text("def tagged(response, example):\n    return float('<answer>' in response)\n")
    task = make_task(TaskConfig(name="chain_sum", size=4, reward={"task": 1, f"{module}:tagged": 0.5}))
    problem = task[0]
    assert task.reward(f"<answer>{problem.answer}</answer>", problem) == 1.5
    assert task.reward(problem.answer, problem) == 1.0 and not math.isnan(task.reward("", problem))
    assert task.passes(f"<answer>{problem.answer}</answer>", problem) and not task.passes("<answer></answer>", problem)
