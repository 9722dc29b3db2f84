"""Speculation statistics under vLLM's counter names.

acceptance length = 1 + num_accepted_tokens / num_drafts   (tokens per verify step)
acceptance rate   = num_accepted_tokens / num_draft_tokens
num_accepted_tokens_per_pos[i] counts drafts whose position i was accepted.
A step run without speculation (K = 0) counts no draft.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def record(self, num_rows: int, k: int, accepted_per_pos: list[int], draft_tokens: int | None = None) -> None:
        """One verify step over `num_rows` rows with k drafts each along the path verified (k = 0 records
        nothing); `draft_tokens` counts every drafted token (a tree's branches), num_rows * k by default."""
        if k == 0:
            return
        self.num_drafts += num_rows
        self.num_draft_tokens += num_rows * k if draft_tokens is None else draft_tokens
        self._add_per_pos(accepted_per_pos)

    def merge(self, other: "SpecStats") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self._add_per_pos(other.num_accepted_tokens_per_pos)

    def _add_per_pos(self, counts: list[int]) -> None:
        self.num_accepted_tokens += sum(counts)
        per_pos = self.num_accepted_tokens_per_pos
        per_pos += [0] * (len(counts) - len(per_pos))
        for i, count in enumerate(counts):
            per_pos[i] += count

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_per_pos(self) -> list[float]:
        """Fraction of drafts whose position i was accepted."""
        return [c / self.num_drafts for c in self.num_accepted_tokens_per_pos] if self.num_drafts else []

    def as_dict(self) -> dict:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "acceptance_length": self.acceptance_length,
            "acceptance_rate": self.acceptance_rate,
        }
