"""Verifiable tasks: `make_task(TaskConfig)` -> prompts and a verifier.

    task        the Task interface, TaskConfig, make_task, render_prompts
    gym         reasoning-gym datasets, scored by their own verifiers
    arithmetic  the `tiny` model's arithmetic ("copy the problem, then answer")
"""
from specrl.tasks.task import Task, TaskConfig, make_task, render_prompts

__all__ = ["Task", "TaskConfig", "make_task", "render_prompts"]
