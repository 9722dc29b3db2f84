"""The int8 self-draft: the policy drafts for itself with its weights rounded to int8.

The draft is the target's own network (`LlamaModel.int8_copy`): every projection and the LM head
rounded to int8 per output row (symmetric, fp32 scale), embeddings and norms shared; activations
rounded to int8 too, in groups of 16, where the CPU has AVX-512 VNNI (the `vnni` kernel), else fp32.
It drafts like any draft model (`DraftModelProposer`: sampled from q at the call's temperature, top-k
and top-p) and goes through the same exact verifier, so the rollouts keep the policy's distribution
exactly; the rounding only costs acceptance.

Being the target's own network, it keeps no KV cache of its own: it drafts in the target's cache
(`ProposalContext.target_cache`), whose positions below `lens` hold the verified tokens' fp32 keys and
values, exactly what its own layers would attend to before rounding. Each proposal feeds only each row's
last token (the one the target emitted, not yet in its cache) and then its drafts, writing their int8 K/V
at slots from `lens` on, which the target's next pass overwrites before it reads them. So there is no
prompt prefill (through the int8 network at M = 60-1000 rows it cost ~0.4 s a call on SmolLM2 and turned
speculation off at batch 4), no copy of the cache, and no catch-up feed of the accepted drafts (a pass
of 1 + accepted tokens per row at the start of every proposal).

It needs no checkpoint and no training, and it never goes stale: each proposal first rebuilds the copy
if the target's weights are no longer the ones it was made from (`load_weights` replaces the target's
layer list, so identity tells; an in-flight weight update included). A rebuild is one quantization pass
over the weights (`rebuild_seconds` keeps the last one's time, ~0.1 s on SmolLM2), paid once per weight
sync and only by a call that drafts: in GRPO a step whose rollouts the planner decodes plainly throughout
pays nothing. The proposal reports it as `setup_seconds`, which the planner does not fit as a draft's cost.
"""
from __future__ import annotations

import time

import torch

from specrl.models.kv_cache import KVCache
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.draft_model import DraftModelProposer
from specrl.speculation.plugin import ProposerKind
from specrl.speculation.proposer import Proposal, ProposalContext


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

    def check_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        raise ValueError(f"{source} were sent, but the int8 self-draft has no trained weights: it is rebuilt "
                         "from the policy's own at every weight sync")

    def load_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        self.check_draft_weights(state, source)

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        self.prefill = self.row_base = self.cache = None  # no prompt to prefill: each proposal reads the target's cache

    def select_rows(self, rows: torch.Tensor) -> None:
        pass  # each proposal starts from the target's cache, whose rows the engine selects

    def propose(self, context: ProposalContext, k: int) -> Proposal:
        """Draft in the target's cache: every position below its lens is verified, so the feed is each row's
        last token (num_tokens = lens + 1), then the drafts (slots lens .. lens + k - 1, room the engine keeps
        for a step's drafts and overwrites with the target's own K/V before reading them)."""
        target = context.target_cache
        if target is None:
            raise ValueError("the int8 self-draft drafts in the target's KV cache: ProposalContext.target_cache "
                             "is required")
        setup = 0.0
        if self.target.layers is not self.built_from:  # the weights changed since the copy was made
            self._rebuild()
            setup = self.rebuild_seconds
        self.cache = KVCache(target.keys, target.values, target.lens.clone())
        self.synced = target.lens.clone()
        proposal = super().propose(context, k)
        proposal.setup_seconds = setup
        return proposal


PLUGIN = ProposerKind(
    "int8", "the policy itself with int8 weights, rebuilt at every weight sync (no training)",
    lambda s: Int8DraftProposer(s.target), default_k=8,  # accepted ~0.97 per token: long chains pay
    vllm_refusal="vLLM has no int8 self-draft (a quantized copy of the policy as its own draft)")
