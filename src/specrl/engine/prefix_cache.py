"""The prompt prefix one generate call shares with the next: its keys and values, kept across calls.

RL prompts begin alike: the chat template's system prompt, then the task's instruction (the smollm2
preset's prompts share their first 35 of ~64 tokens). The engine keeps what its prefill computed for the
last call's first prompt: each layer's K/V and the hidden states its proposer reads. A call whose prompts
all begin with c of those tokens copies them into its cache and prefills only the rest. Where a call's
prompts share more than that among themselves (`common_prefix`: a GRPO step's first call after a weight
sync finds no entry), the shared tokens run once, on the first prompt's row, become the entry and are
copied likewise. vLLM's automatic prefix caching does the same by blocks over many prompts; one prompt is
what a stream of RL calls reuses.

    count = prefix.match(tokens, lengths, model.layers)   tokens shared by every prompt (0: none)
    hidden = prefix.reuse(cache, count)                   K/V copied into every row; the hidden states
    ... prefill tokens[:, count:] ...
    prefix.keep(tokens[0], prefilled, cache, hidden, model.layers)

Exactness: a position's K/V depend only on the tokens up to it and on the weights. So an entry is used only
while the model's layer list is the one it was computed with (`LlamaModel.load_weights` replaces the list),
and the engine drops it at every weight load. The copied values are the prefill's own bits wherever the
layer kernel ran the prefill (at most 128 rows; it is batch-invariant); above that PyTorch's kernels may
differ from a fresh prefill in the last bits, as any two batch shapes do.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specrl.models.kv_cache import KVCache


@dataclass
class _Entry:
    tokens: torch.Tensor  # [s] long: the prompt's first s tokens
    keys: list[torch.Tensor]  # per layer [Hkv, s, D]
    values: list[torch.Tensor]
    hidden: dict[int, torch.Tensor]  # per hidden layer the proposer reads, [s, H]
    layers: list  # the model's layer list (its weights) when computed


def common_prefix(tokens: torch.Tensor, lengths: torch.Tensor) -> int:
    """How many first tokens all the prompts (tokens [P, S], lengths [P]) share, at most each one's length - 1
    (its last token is fed by the first step); 0 for a single prompt, which has no other to share with."""
    if tokens.shape[0] < 2:
        return 0
    same = int((tokens == tokens[:1]).all(dim=0).long().cumprod(dim=0).sum())
    return min(same, int(lengths.min()) - 1)


class PrefixCache:
    def __init__(self):
        self._entry: _Entry | None = None

    def clear(self) -> None:
        self._entry = None

    def match(self, tokens: torch.Tensor, lengths: torch.Tensor, layers: list) -> int:
        """How many first tokens every prompt (tokens [P, S], lengths [P]) shares with the entry, at most each
        prompt's length - 1 (its last token is fed by the first step); 0 without an entry for these weights."""
        entry = self._entry
        if entry is None or entry.layers is not layers:
            return 0
        span = min(entry.tokens.numel(), tokens.shape[1])
        shared = (tokens[:, :span] == entry.tokens[:span]).long().cumprod(dim=1).sum(dim=1)  # [P]
        return int(torch.minimum(shared, lengths - 1).min())

    def reuse(self, cache: KVCache, count: int) -> dict[int, torch.Tensor]:
        """Copy the entry's first `count` positions into every row of `cache`; returns its hidden states
        there, {layer: [count, H]}."""
        if count == 0:
            return {}
        entry = self._entry
        for store, kept in zip(cache.keys + cache.values, entry.keys + entry.values):
            store[:, :, :count] = kept[:, :count]
        return {layer: h[:count] for layer, h in entry.hidden.items()}

    def keep(self, tokens: torch.Tensor, count: int, cache: KVCache, hidden: dict[int, torch.Tensor],
             layers: list) -> None:
        """Keep row 0's first `count` positions: its tokens [>= count], K/V from `cache` and hidden states
        {layer: [rows, >= count, H]}, computed with the weights `layers`."""
        self._entry = _Entry(tokens[:count].clone(), [k[0, :, :count].clone() for k in cache.keys],
                             [v[0, :, :count].clone() for v in cache.values],
                             {layer: h[0, :count].clone() for layer, h in hidden.items()}, layers)
