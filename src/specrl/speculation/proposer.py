"""The one interface every draft mechanism implements.

A proposer sees the live batch's token history and returns K draft tokens per row,
with the draft distribution q they were sampled from (or None when the proposal is
deterministic: n-gram, suffix). The engine hands the proposal to `verify`, so any
proposer, however good or bad, leaves the output distribution exact; a bad one only
costs speed.

Lifecycle, driven by the engine for one generate() call:
    start(tokens, num_tokens, params)       after the prompt prefill, one row per distinct prompt
    select_rows(group)                      the rows are then repeated n times (the GRPO group)
    propose(context, k) -> Proposal         once per speculative step, k >= 1 (not every step:
                                            adaptive K may run steps without speculation)
    propose_tree(context, k, width)         instead of `propose`, for proposers with max_width > 1:
        -> TreeProposal                     `width` candidate first tokens, each with k - 1 drafts
    observe(hidden, start, count, tokens)   after every target forward, the prefill included, for
                                            proposers that read the target's hidden states
                                            (`hidden_layers` non-empty; see `head_proposer`)
    select_rows(rows)                       when finished rows leave the batch
A proposer that remembers across calls (the suffix proposer's earlier rollouts) returns that
memory from `state_dict()` as plain JSON-ready data, which checkpoints save and
`load_state_dict` restores; the others return {}.
`StatelessProposer` gives the no-op lifecycle to proposers that keep nothing between calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specrl.kernels import draft_sampler
from specrl.models.kv_cache import KVCache
from specrl.sampling import SamplingParams, draw, sampling_distribution
from specrl.speculation import drafter_invariant


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, K] long
    probs: torch.Tensor | None  # [B, K, V] draft distribution q, or None for one-hot proposals
    # one-off work inside this proposal (the int8 self-draft's rebuild after a weight sync): the call's draft time
    # counts it; the planner does not fit it as what drafting costs a step
    setup_seconds: float = 0.0


@dataclass
class TreeProposal:
    """w candidate first tokens per row, each followed by its own chain (see `speculation.tree`)."""

    candidates: torch.Tensor  # [B, w] long: drawn without replacement from q_first (or deterministic)
    q_first: torch.Tensor | None  # [B, V] the distribution the candidates were drawn from; None = deterministic
    drafts: torch.Tensor  # [B, w, k-1] long: each branch's drafts after its candidate
    q_drafts: torch.Tensor | None  # [B, w, k-1, V], or None (one-hot)
    setup_seconds: float = 0.0  # as `Proposal`'s


def one_hot_proposal(found: list[list[int]], histories_last: list[int], k: int) -> Proposal:
    """A deterministic proposal from per-row lookups that may come up short.

    A row's draft is what it found, padded to k by repeating its last found token (or the
    row's last token when nothing was found): a cheap guess, still verified exactly.
    Example: found [[4, 5], []], last tokens [9, 7], k 3 -> [[4, 5, 5], [7, 7, 7]].
    """
    drafts = [row + [row[-1] if row else last] * (k - len(row)) for row, last in zip(found, histories_last)]
    return Proposal(tokens=torch.tensor(drafts, dtype=torch.long).view(-1, k), probs=None)


def to_target_vocab(probs: torch.Tensor, d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """[.., V_out] -> [.., V]: a reduced-vocabulary draft puts zero mass outside its ids d2t [V_out]."""
    if d2t is None:
        return probs
    return probs.new_zeros(*probs.shape[:-1], vocab_size).index_copy_(-1, d2t, probs)


def uses_draft_sampler(logits: torch.Tensor, params: SamplingParams) -> bool:
    """Whether a draft token is drawn in one kernel call (`kernels.draft_sampler.sample`): a temperature above 0,
    no top-k or top-p, and logits the kernel takes (fp32 on the CPU, the library built)."""
    return not params.greedy and not params.top_k and params.top_p >= 1.0 and draft_sampler.takes(logits)


def sample_draft_token(logits: torch.Tensor, d2t: torch.Tensor | None, vocab_size: int, params: SamplingParams,
                       generator: torch.Generator | None,
                       keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One drafted token per row from a draft's logits [B, V_out] -> (token [B], q [B, V]).

    q is the draft's distribution under the call's sampling params, over the target's
    vocabulary; at temperature 0 it is one-hot on the argmax and the token is that argmax.
    keys [B]: drafter-invariant sampling's keys of the positions drafted for: the token is the race on q there
    (`drafter_invariant.race`, over the target's ids, as the target's token will be), which couples it to the
    target's.
    """
    raced = keys is not None and not params.greedy
    if uses_draft_sampler(logits, params):  # untruncated, at a temperature: one kernel call (its token unused if raced)
        token, q = draft_sampler.sample(logits, params.temperature, generator)
    else:
        q, _ = sampling_distribution(logits, params)
        token = None if raced else q.argmax(-1) if params.greedy else draw(q, generator)
    q = to_target_vocab(q, d2t, vocab_size)
    if raced:
        return drafter_invariant.race(q, keys), q
    # drawn in the draft's own V_out ids, then mapped: d2t is one to one, so the law is the same, and
    # sampling 8192 ids instead of SmolLM2's 49152 is ~6x cheaper
    return (token if d2t is None else d2t[token]), q


@dataclass
class ProposalContext:
    tokens: torch.Tensor  # [B, S_max] long: prompt + generated tokens of each live row
    num_tokens: torch.Tensor  # [B] long: valid entries of `tokens` per row (the last is not yet in the target's cache)
    params: SamplingParams
    generator: torch.Generator | None
    vocab_size: int  # the target's vocabulary size V
    groups: torch.Tensor  # [B] long: the prompt each live row samples (rows of a GRPO group share it)
    verify_seconds: float | None = None  # the previous step's time outside the proposer (target pass, verify, bookkeeping)
    # the target's KV cache of the live rows: positions < its lens hold the verified tokens' K/V, which a proposer
    # must not change; it may write at slots from lens on (the room a step's drafts need), which the target's next
    # pass overwrites before it reads them (the int8 self-draft drafts there)
    target_cache: KVCache | None = None
    # [B, k] drafter-invariant sampling's noise keys of the positions the k drafts are for (`drafter_invariant`;
    # draw a sampled draft at depth j with `sample_draft_token(..., keys=noise_keys[:, j])`); None otherwise
    noise_keys: torch.Tensor | None = None

    def keys_at(self, depth: int) -> torch.Tensor | None:
        """[B] the noise keys of the position a depth-`depth` draft is for, or None (not drafter-invariant)."""
        return None if self.noise_keys is None else self.noise_keys[:, depth]


class Proposer(Protocol):
    name: str
    # target layers whose hidden states this proposer reads (EAGLE-3 / MTP heads); () for none
    hidden_layers: tuple[int, ...]
    max_width: int  # most candidate first tokens it drafts as a tree (1 = chains only)

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None: ...

    def propose(self, context: ProposalContext, k: int) -> Proposal: ...

    def observe(self, hidden: dict[int, torch.Tensor], start: torch.Tensor, count: torch.Tensor,
                tokens: torch.Tensor) -> None: ...

    def select_rows(self, rows: torch.Tensor) -> None: ...

    def restart(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams,
                hidden: dict[int, torch.Tensor]) -> None:
        """The weights changed mid-call (an in-flight update): rebuild what was computed from the old
        ones for the live rows. `hidden` holds the target's new states at positions
        [0, num_tokens - 1) of every row. Drafts never change what is sampled, so this is for
        acceptance only."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def check_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Raise ValueError naming `source` unless this proposer drafts with trained weights (a draft model's
        or a head's, under its checkpoint's names) that `state` fits; changes nothing."""

    def load_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Weight sync of the trained draft: replace its weights with `state` (refused as
        `check_draft_weights` refuses, with nothing replaced)."""


class NoTrainedWeights:
    """The refit of a proposer that drafts with no trained weights: any sent are refused."""

    def check_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        raise ValueError(f"{source} were sent, but the {self.name} proposer has no draft model or head to load "
                         "them into")

    def load_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        self.check_draft_weights(state, source)


class CallScopedState(NoTrainedWeights):
    """`state_dict` / `load_state_dict` of a proposer whose state lives for one generate() call only
    (and a chain-only `max_width`); `restart` starts it afresh on the live rows, as after the prefill."""

    max_width = 1

    def restart(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams,
                hidden: dict[int, torch.Tensor]) -> None:
        self.start(tokens, num_tokens, params)
        if hidden:
            self.observe(hidden, torch.zeros_like(num_tokens), num_tokens - 1, tokens)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state across calls, but was given {sorted(state)}")


class StatelessProposer(CallScopedState):
    """The lifecycle of a proposer that keeps nothing between steps and reads no hidden states."""

    hidden_layers: tuple[int, ...] = ()

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        pass

    def observe(self, hidden, start, count, tokens) -> None:
        pass

    def select_rows(self, rows: torch.Tensor) -> None:
        pass
