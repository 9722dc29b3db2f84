"""Verifiable tasks: `make_task(TaskConfig)` -> prompts and a verifier.

    task             the Task interface, TaskConfig, make_task, render_prompts
    gym              reasoning-gym datasets, scored by their own verifiers or specrl's rewrites
    safe_scorers     the rewrites, for datasets whose own scorer runs the answer as code
    safe_arithmetic  the exact arithmetic parser countdown's and puzzle24's rewrites read answers with
    arithmetic       the `tiny` model's arithmetic ("copy the problem, then answer")
"""
from specrl.tasks.task import Task, TaskConfig, make_task, render_prompts

__all__ = ["Task", "TaskConfig", "make_task", "render_prompts"]
