"""A small external draft model with its own KV cache.

The draft runs the same token sequence as the target. Each step it drafts k tokens
autoregressively, sampling each from q = its own distribution at the call's
temperature (greedy at temperature 0, with q one-hot). Its cache is kept in step
with the target without per-row bookkeeping: every step re-feeds the row's last two
tokens (positions num_tokens-2 and num_tokens-1). After a step that accepted m of k
drafts the draft's cache holds correct entries up to position num_tokens-3 of the
new state, whatever m was, so re-feeding those two positions is always enough.

A draft with a reduced output vocabulary (config `draft_vocab_size` and a `d2t`
tensor mapping draft ids to target ids) puts zero probability outside those ids.
"""
from __future__ import annotations

import torch

from specrl.engine.kv_cache import KVCache
from specrl.engine.model import LlamaModel
from specrl.engine.sampling import SamplingParams, sampling_distribution
from specrl.spec.proposer import Proposal, ProposalContext


class DraftModelProposer:
    name = "draft"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model: LlamaModel, target_vocab_size: int):
        if model.cfg.vocab_size != target_vocab_size:
            raise ValueError(
                f"draft/target vocabulary mismatch: draft {model.source} has vocab_size {model.cfg.vocab_size}, "
                f"target has {target_vocab_size}; a draft must share the target's tokenizer"
            )
        self.model = model
        self.target_vocab_size = target_vocab_size
        self.cache: KVCache | None = None

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        max_len = tokens.shape[1]
        self.cache = self.model.new_cache(tokens.shape[0], max_len)
        prefill = int(num_tokens.max()) - 2
        if prefill > 0:  # everything but the two tokens the first propose() feeds
            self.model.forward(tokens[:, :prefill], self.cache)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.select_rows(rows)

    def _to_target_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """[B, V_draft] -> [B, V_target] (identity unless the draft's vocabulary is reduced)."""
        if self.model.d2t is None:
            return probs
        full = probs.new_zeros(probs.shape[0], self.target_vocab_size)
        return full.index_copy_(1, self.model.d2t, probs)

    def propose(self, context: ProposalContext, k: int) -> Proposal:
        B = context.tokens.shape[0]
        rows = torch.arange(B)
        self.cache.lens = (context.num_tokens - 2).clamp_min(0)
        last2 = torch.stack([context.tokens[rows, (context.num_tokens - 2).clamp_min(0)],
                             context.tokens[rows, context.num_tokens - 1]], dim=1)  # [B, 2]
        # A row whose history is one token feeds it twice: its draft reads the output at
        # position 0, and the duplicate at position 1 is overwritten by the next feed.
        single = (context.num_tokens < 2).long()  # [B]
        feed, read = last2, 1 - single
        tokens, probs = [], []
        for _ in range(k):
            logits, _ = self.model.forward(feed, self.cache)
            self.cache.lens += read + 1
            q, _ = sampling_distribution(logits[rows, read], context.params)
            q = self._to_target_vocab(q)
            token = q.argmax(-1) if context.params.greedy else torch.multinomial(q, 1, generator=context.generator).squeeze(1)
            tokens.append(token)
            probs.append(q)
            feed, read = token.unsqueeze(1), torch.zeros_like(read)
        draft_tokens = torch.stack(tokens, 1)
        return Proposal(tokens=draft_tokens, probs=None if context.params.greedy else torch.stack(probs, 1))
