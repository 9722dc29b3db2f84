"""The int8 self-draft: the policy drafts for itself with its weights rounded to int8.

The draft is the target's own network (`LlamaModel.int8_copy`): every projection and the LM head
rounded to int8 per output row (symmetric, fp32 scale), embeddings and norms shared, activations
fp32, its own KV cache. It drafts like any draft model (`DraftModelProposer`: sampled from q at the
call's temperature, top-k and top-p) and goes through the same exact verifier, so the rollouts keep
the policy's distribution exactly; the rounding only costs acceptance.

Being the target's own network, it needs no prompt prefill: at its first proposal in a call it takes
a copy of the target's KV cache of the live rows, every verified position included (the target's
fp32 keys and values, a memory copy instead of a pass of the int8 network over the prompt, which on
SmolLM2 at 1 thread cost ~0.4 s a call and turned speculation off at batch 4), and drafts on from
there with its own int8 passes.

It needs no checkpoint and no training, and it never goes stale: `start` (each generate call, and
the restart after an in-flight weight update) rebuilds the copy whenever the target's weights are
no longer the ones it was made from (`load_weights` replaces the target's layer list, so identity
tells). A rebuild is one quantization pass over the weights (`rebuild_seconds` keeps the last one's
time), paid once per weight sync.
"""
from __future__ import annotations

import time

import torch

from specrl.engine.kv_cache import KVCache
from specrl.engine.model import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.draft_model import DraftModelProposer
from specrl.speculation.proposer import ProposalContext


class Int8DraftProposer(DraftModelProposer):
    name = "int8"

    def __init__(self, target: LlamaModel):
        self.target = target
        self.built_from: list | None = None  # the target's layer list the copy was made from
        self.rebuild_seconds = 0.0
        super().__init__(self._rebuild(), target.cfg.vocab_size)

    def _rebuild(self) -> LlamaModel:
        start = time.perf_counter()
        self.model = self.target.int8_copy()
        self.built_from = self.target.layers
        self.rebuild_seconds = time.perf_counter() - start
        return self.model

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        if self.target.layers is not self.built_from:
            self._rebuild()
        super().start(tokens, num_tokens, params)

    def _prefill(self, context: ProposalContext) -> None:
        """Adopt the target's cache of the live rows: the positions below its lens are the K/V an fp32 draft
        would compute, so nothing is left to feed but each row's last token."""
        target = context.target_cache
        if target is None:
            raise ValueError("the int8 self-draft drafts on from the target's KV cache: ProposalContext.target_cache "
                             "is required")
        self.cache = KVCache([k.clone() for k in target.keys], [v.clone() for v in target.values], target.lens.clone())
        self.synced = target.lens.clone()
        self.prefill = self.row_base = None
