"""The int8 self-draft: the policy drafts for itself with its weights rounded to int8.

The draft is the target's own network (`LlamaModel.int8_copy`): every projection and the LM head
rounded to int8 per output row (symmetric, fp32 scale), embeddings and norms shared, activations
fp32, its own KV cache. It drafts like any draft model (`DraftModelProposer`: sampled from q at the
call's temperature, top-k and top-p) and goes through the same exact verifier, so the rollouts keep
the policy's distribution exactly; the rounding only costs acceptance.

It needs no checkpoint and no training, and it never goes stale: `start` (each generate call, and
the restart after an in-flight weight update) rebuilds the copy whenever the target's weights are
no longer the ones it was made from (`load_weights` replaces the target's layer list, so identity
tells). A rebuild is one quantization pass over the weights (`rebuild_seconds` keeps the last one's
time), paid once per weight sync.
"""
from __future__ import annotations

import time

import torch

from specrl.engine.model import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.draft_model import DraftModelProposer


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
