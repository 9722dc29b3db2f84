"""Held-out pass@k of a policy on its task, with a confidence interval.

The held-out set is `task.held_out(eval.prompts)`: a generated task's last problems, or a
file task's held-out rows (`specrl.tasks.task`). A sample is correct when `task.passes` it
(its reward reaches task.pass_threshold).

Per problem i with n samples and c_i correct:
    pass@k_i = 1 - C(n - c_i, k) / C(n, k)          (the unbiased estimator of Chen et al. 2021)
    pass@k   = mean_i pass@k_i,  95% CI = pass@k +- 1.96 * sd_i(pass@k_i) / sqrt(P)
The interval treats problems as the sampled unit (samples of one problem are not independent).
With n = 1 it is the usual normal interval of a proportion.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import ClassVar

from specrl.sampling import SamplingParams
from specrl.tasks import Task
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class EvalConfig:
    """Held-out pass@k during training (both pipeline modes)."""

    SECTION: ClassVar[str] = "eval"

    every: int = within(0, "[0, inf)")  # evaluate before step 1 and after every N-th step (and the last); 0 = never
    prompts: int = within(200, "[1, inf)")  # held-out problems (task.held_out: a generated task's last ones)
    n: int = within(1, "[1, inf)")  # samples per problem (pass@k for k = 1, 2, 4, .. <= n)
    temperature: float = within(1.0, "[0, inf)")  # 0 = greedy
    batch: int = within(64, "[1, inf)")  # prompts per generate call

    def __post_init__(self):
        check_fields(self)


def pass_at_k(n: int, correct: int, k: int) -> float:
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def summarise(correct: list[int], n: int) -> dict:
    """pass@k (k = 1, 2, 4, .. <= n) with 95% confidence intervals over problems."""
    out = {"problems": len(correct), "samples_per_problem": n}
    k = 1
    while k <= n:
        per_problem = [pass_at_k(n, c, k) for c in correct]
        mean = statistics.fmean(per_problem)
        half = 1.96 * statistics.pstdev(per_problem) / math.sqrt(len(per_problem)) if len(per_problem) > 1 else 0.0
        out[f"pass@{k}"] = round(mean, 4)
        out[f"pass@{k}_ci95"] = [round(max(0.0, mean - half), 4), round(min(1.0, mean + half), 4)]
        k *= 2
    return out


def evaluate(backend, task: Task, tokenizer, config: EvalConfig, max_tokens: int, seed: int,
             progress=None, completions: list | None = None) -> dict:
    """Sample `config.n` responses to each held-out problem with `backend` and score them with the
    task's verifier -> `summarise(...)` plus the tokens and seconds it took. `progress(done, total)`;
    the completions are appended to `completions` when given."""
    held_out = task.held_out(config.prompts)
    params = SamplingParams(n=config.n, temperature=config.temperature, max_tokens=max_tokens, seed=seed)
    correct, tokens, seconds = [], 0, 0.0
    for start in range(0, len(held_out), config.batch):
        problems = held_out[start:start + config.batch]
        result = backend.generate([task.render(p, tokenizer) for p in problems], params)
        tokens, seconds = tokens + result.num_tokens, seconds + result.seconds
        if completions is not None:
            completions.extend(result.completions)
        for j, problem in enumerate(problems):
            samples = result.completions[j * config.n:(j + 1) * config.n]
            correct.append(sum(int(task.passes(c.text, problem)) for c in samples))
        if progress is not None:
            progress(len(correct), len(held_out))
    return {**summarise(correct, config.n), "tokens": tokens, "generation_seconds": round(seconds, 2)}
