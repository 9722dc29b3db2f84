"""A GRPO group: one prompt's G sampled responses with their rewards, the unit both pipelines train on.

The sync loop scores its groups in the trainer's process; the async pipeline's
rollout actors score theirs before handing them over, so a group in the buffer is
ready to train on. Either way the same two functions pick the prompts and score them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specrl.generation import Completion


@dataclass
class Group:
    """One prompt's G completions, scored."""

    index: int  # data position: the problem is task[index]
    prompt_ids: list[int]
    completions: list[Completion]  # G of them, in sample order
    rewards: list[float]  # [G], the task's reward of each completion (its named rewards weighted and summed)
    issued_version: int  # the weight version the generate call started from
    reward_parts: dict[str, list[float]] = field(default_factory=dict)  # each named reward's [G] values
    reward_errors: list = field(default_factory=list)  # (reward, why) where a reward function raised, per failed sample

    @property
    def version(self) -> int:
        """The oldest weight version that produced any of its tokens (the group's age is counted from it)."""
        return min((v for c in self.completions for v in c.versions), default=self.issued_version)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)


def score_groups(task, first: int, problems: list, completions: list[Completion], issued_version: int) -> list[Group]:
    """Prompt-major completions (n per prompt) -> one scored Group per prompt, indexed from `first`."""
    n = len(completions) // len(problems)
    groups = []
    for i, problem in enumerate(problems):
        members = completions[i * n:(i + 1) * n]
        if any(c.prompt_index != i for c in members):
            raise ValueError("completions are not prompt-major with n samples per prompt")
        scores = [task.score(c.text, problem) for c in members]
        groups.append(Group(index=first + i, prompt_ids=members[0].prompt_ids, completions=members,
                            rewards=[s.reward for s in scores], issued_version=issued_version,
                            reward_parts={name: [s.parts[name] for s in scores] for name in scores[0].parts},
                            reward_errors=[s.error for s in scores if s.error is not None]))
    return groups
