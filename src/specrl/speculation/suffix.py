"""Group-suffix drafting: propose continuations seen in sibling rollouts of the same prompt.

In GRPO every prompt is sampled G times, and siblings often share phrasing, steps and
answers (Seer reports up to 2x rollout throughput from this). For each row the
proposer looks up the longest tail of its own history (n = max_n down to min_n
tokens) that also occurs in the group's token store: its prompt, every sibling's
response so far (live or finished), and its own earlier tokens. It proposes the
tokens that followed the match. The proposal is deterministic (q one-hot), costs no
model call, and goes through the same exact verifier as every other draft.

Optionally (`SuffixConfig.remember`), the store also holds the same prompt's rollouts from
earlier generate() calls (RhymeRL's observation: a prompt's rollouts in one epoch resemble
the next epoch's): at each call's start the previous call's groups are filed under their
prompt's tokens, index and all, and a group whose prompt was seen before continues that index
(nothing is re-indexed per call). A filed group keeps its newest `per_prompt` sequences, trimmed
(re-indexed) once it holds twice that many.

The store is an n-gram index per group, `{(n-gram): [(sequence, end), ...]}`, updated
incrementally with the tokens each step emits, so a lookup costs O(max_n) dict probes.
Among matches of the longest n, the one with the longest continuation wins (siblings
that already got further are the best guides); ties go to the most recent.
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import torch

from specrl.sampling import SamplingParams
from specrl.speculation.plugin import ProposerKind
from specrl.speculation.proposer import NoTrainedWeights, Proposal, ProposalContext, one_hot_proposal
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class SuffixConfig:
    max_n: int = 6  # longest tail to match
    min_n: int = 2  # shortest tail to match (1 matches too eagerly)
    remember: int = within(256, "[0, inf)")  # distinct prompts whose rollouts are kept across calls (least recently seen go); 0 = none
    per_prompt: int = within(16, "[1, inf)")  # earlier sequences kept per remembered prompt (up to twice as many
    # between trims)

    def __post_init__(self):
        check_fields(self)
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"SuffixConfig needs 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")


class GroupIndex:
    """Token sequences of one prompt's group and an n-gram index over them."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.sequences: list[list[int]] = []
        self.index: dict[tuple, list[tuple[int, int]]] = defaultdict(list)

    @classmethod
    def of(cls, sequences: list[list[int]], min_n: int, max_n: int) -> GroupIndex:
        index = cls(min_n, max_n)
        for tokens in sequences:
            index.new_sequence(tokens)
        return index

    def new_sequence(self, tokens: list[int]) -> int:
        self.sequences.append([])
        seq = len(self.sequences) - 1
        self.extend(seq, tokens)
        return seq

    def extend(self, seq: int, tokens: list[int]) -> None:
        """Append tokens to sequence `seq`, indexing every n-gram that ends at a new position."""
        store = self.sequences[seq]
        for token in tokens:
            store.append(token)
            end = len(store)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.index[tuple(store[end - n:end])].append((seq, end))

    def lookup(self, seq: int, k: int) -> list[int]:
        """Up to k tokens that followed the longest match of sequence `seq`'s tail elsewhere."""
        own = self.sequences[seq]
        for n in range(min(self.max_n, len(own)), self.min_n - 1, -1):
            best: list[int] = []
            for other, end in reversed(self.index.get(tuple(own[-n:]), ())):
                if other == seq and end == len(own):
                    continue  # the tail itself
                follow = self.sequences[other][end:end + k]
                if len(follow) > len(best):
                    best = follow
                    if len(best) == k:
                        break
            if best:
                return best
        return []


class SuffixProposer(NoTrainedWeights):
    max_width = 1  # chains only
    name = "suffix"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, config: SuffixConfig = SuffixConfig()):
        self.config = config
        self.memory: OrderedDict[tuple, GroupIndex] = OrderedDict()  # prompt tokens -> its earlier sequences, indexed
        self.groups: dict[int, GroupIndex] = {}
        self.prompt_keys: list[tuple] = []

    def _filed(self) -> OrderedDict:
        """The memory with the last call's groups filed under their prompts (a group continues the index it was
        seeded with: the earlier sequences, then this call's), each trimmed to its newest `per_prompt` sequences
        once it holds twice that many."""
        memory = OrderedDict(self.memory)
        keep = self.config.per_prompt
        for group, index in self.groups.items():
            key = self.prompt_keys[group]
            memory.pop(key, None)  # re-inserted last: the most recently seen prompt
            memory[key] = index if len(index.sequences) < 2 * keep else \
                GroupIndex.of(index.sequences[-keep:], self.config.min_n, self.config.max_n)
        while len(memory) > self.config.remember:
            memory.popitem(last=False)
        return memory

    def state_dict(self) -> dict:
        """The remembered rollouts, this call's included: {"memory": [[prompt ids, [sequence, ...]], ...]}, oldest
        prompt first, the newest `per_prompt` sequences of each."""
        keep = self.config.per_prompt
        return {"memory": [[list(key), index.sequences[-keep:]] for key, index in self._filed().items()]}

    def load_state_dict(self, state: dict) -> None:
        self.memory = OrderedDict((tuple(key), GroupIndex.of(sequences, self.config.min_n, self.config.max_n))
                                  for key, sequences in state.get("memory", []))
        self.groups, self.prompt_keys = {}, []

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        """Called with one row per distinct prompt (before the rows are repeated n times)."""
        if self.config.remember:
            self.memory = self._filed()
        self.prompt_keys = [tuple(row[:n]) for row, n in zip(tokens.tolist(), num_tokens.tolist())]
        self.groups: dict[int, GroupIndex] = {}
        self.row_seq: list[tuple[int, int]] = []  # live row -> (group, sequence id)
        self.indexed: list[int] = []  # live row -> tokens of its history already indexed

    def select_rows(self, rows: torch.Tensor) -> None:
        """Finished rows stay in their group's store (siblings keep learning from them)."""
        if not self.row_seq:  # nothing indexed yet: the first propose() indexes the live rows
            return
        picked = rows.tolist()
        self.row_seq = [self.row_seq[r] for r in picked]
        self.indexed = [self.indexed[r] for r in picked]

    def observe(self, hidden, start, count, tokens) -> None:
        pass  # the store is updated from the tokens at each proposal

    def restart(self, tokens, num_tokens, params, hidden) -> None:
        pass  # built from tokens alone: new weights leave it valid

    def _sync(self, context: ProposalContext) -> None:
        """Index whatever each live row emitted since the last call (its whole history at first)."""
        histories = context.tokens.tolist()
        lengths = context.num_tokens.tolist()
        if not self.row_seq:
            for row, group in enumerate(context.groups.tolist()):
                if group not in self.groups:  # the prompt's remembered index, continued, or a new one
                    self.groups[group] = self.memory.get(self.prompt_keys[group]) or \
                        GroupIndex(self.config.min_n, self.config.max_n)
                index = self.groups[group]
                self.row_seq.append((group, index.new_sequence(histories[row][:lengths[row]])))
                self.indexed.append(lengths[row])
            return
        for row, (group, seq) in enumerate(self.row_seq):
            self.groups[group].extend(seq, histories[row][self.indexed[row]:lengths[row]])
            self.indexed[row] = lengths[row]

    def lookup(self, context: ProposalContext, k: int) -> tuple[list[list[int]], list[int]]:
        """Per live row: the up-to-k tokens found, and the row's last token."""
        self._sync(context)
        found = [self.groups[group].lookup(seq, k) for group, seq in self.row_seq]
        last = [self.groups[group].sequences[seq][-1] for group, seq in self.row_seq]
        return found, last

    def propose(self, context: ProposalContext, k: int) -> Proposal:
        return one_hot_proposal(*self.lookup(context, k), k)


PLUGIN = ProposerKind(
    "suffix", "sibling rollouts of the same prompt (the GRPO group) and its earlier rollouts",
    lambda s: SuffixProposer(), vllm_refusal="vLLM has no group-suffix (sibling rollout) proposer")
