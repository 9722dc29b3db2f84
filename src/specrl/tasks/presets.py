"""The task each built-in model's RL preset trains on, and its prompts as RL renders them.

`pipeline.config.PRESETS` takes each model's task section from here; drafts, heads and benches sample
`preset_prompts`, so they see the prompts RL samples.
"""
from __future__ import annotations

import copy

from specrl.tasks.task import TaskConfig, make_task, render_prompts

MODEL_TASKS: dict[str, dict] = {
    "tiny": {"name": "arithmetic", "difficulty": {"digits": 2, "ops": ["+"]}},
    # two-term sums (reasoning-gym chain_sum): SmolLM2-135M-Instruct's held-out pass@1 is ~0.14 at temperature 0.7
    # before training
    "smollm2-135m": {"name": "chain_sum", "difficulty": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                          "max_digits": 2}},
}


def model_task(model: str) -> dict:
    """A fresh copy of the task section of `model`'s preset (chain_sum for a model without one)."""
    return copy.deepcopy(MODEL_TASKS.get(model, MODEL_TASKS["smollm2-135m"]))


def preset_prompts(model: str, tokenizer, count: int, seed: int) -> list[str]:
    """`count` prompts of the task a model's RL preset trains on (`model_task`), drawn from `seed` and rendered
    as RL renders them."""
    task = make_task(TaskConfig(**{**model_task(model), "seed": seed}))
    return render_prompts(task, tokenizer, 0, count)[1]
