"""Prompt-lookup (n-gram) drafting: propose what followed the last match of the row's tail.

For each row, find the most recent earlier occurrence of its last n tokens
(n = max_n down to min_n) in its own prompt + generation, and propose the k tokens
that followed it. The proposal is deterministic (q one-hot), costs no model call,
and pays off when outputs copy their inputs (e.g. "restate the problem, then answer").

Example: history [7, 1, 2, 9, 4, 1, 2], max_n = 2 -> tail [1, 2] matched at index 1,
followed by [9, 4, 1] -> draft [9, 4, 1] for k = 3. A row with no match (or a short
continuation) is padded by repeating its last token: a cheap guess, still exact.
"""
from __future__ import annotations

from dataclasses import dataclass

from specrl.speculation.plugin import ProposerKind
from specrl.speculation.proposer import Proposal, ProposalContext, StatelessProposer, one_hot_proposal


@dataclass(frozen=True)
class NgramConfig:
    max_n: int = 3  # longest tail to match
    min_n: int = 1  # shortest tail to match

    def __post_init__(self):
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"NgramConfig needs 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")


def lookup(history: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """The up-to-k tokens that followed the latest earlier match of history's tail."""
    size = len(history)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        tail = history[size - n:]
        for start in range(size - n - 1, -1, -1):
            if history[start:start + n] == tail:
                return history[start + n:start + n + k]
    return []


class NgramProposer(StatelessProposer):
    name = "ngram"

    def __init__(self, config: NgramConfig = NgramConfig()):
        self.config = config

    def propose(self, context: ProposalContext, k: int) -> Proposal:
        found, last = [], []
        for row, length in zip(context.tokens.tolist(), context.num_tokens.tolist()):
            found.append(lookup(row[:length], k, self.config.max_n, self.config.min_n))
            last.append(row[length - 1])
        return one_hot_proposal(found, last, k)


PLUGIN = ProposerKind(
    "ngram", "prompt lookup: what followed the latest match of the row's tail",
    lambda s: NgramProposer(NgramConfig(max_n=s.ngram_max_n)),
    vllm=lambda v: {"method": "ngram", "prompt_lookup_max": v.ngram_max_n, "prompt_lookup_min": 1})
