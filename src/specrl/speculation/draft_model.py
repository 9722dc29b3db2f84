"""A small external draft model with its own KV cache.

The draft runs the same token sequence as the target. Each step it drafts k tokens
autoregressively, sampling each from q = its own distribution at the call's
temperature (greedy at temperature 0, with q one-hot). Its cache is kept in step with
the target by one per-row count, `synced`: the positions below it hold verified tokens.
A proposal first feeds every token from `synced` to the row's end (the tokens emitted
since its last proposal: one step's worth, or more after steps run without
speculation), then its drafts; the draft entries past the verified end are simply
overwritten by the next proposal's feed. The prompt's prefill waits for the first proposal: it
runs on the prompt rows, whose cache is then repeated to the live rows, so a call that never
speculates never runs the draft (a prefill up front would be a fixed cost on every call decoded plainly).

A draft with a reduced output vocabulary (config `draft_vocab_size` and a `d2t`
tensor mapping draft ids to target ids) puts zero probability outside those ids.
"""
from __future__ import annotations

import time

import torch

from specrl.models.checkpoint import read_config_json
from specrl.models.kv_cache import KVCache
from specrl.models.reduced_vocab import SHARED_KEY
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.plugin import ProposerKind, ProposerSetup, VLLMSetup
from specrl.speculation.proposer import CallScopedState, Proposal, ProposalContext, sample_draft_token


class DraftModelProposer(CallScopedState):
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

    def check_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        self.model.check_weights(state, source=source)

    def load_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        self.model.load_weights(state, source=source)

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        # all but each prompt's last token (rows past their own prompt hold junk, overwritten later), at the first
        # proposal; row_base: each live row's row among these
        self.prefill: torch.Tensor | None = tokens[:, :int(num_tokens.max()) - 1].clone()
        self.row_base = torch.arange(tokens.shape[0])
        self.cache = None
        self.synced = (num_tokens - 1).clamp_min(0)  # [B]

    def _prefill(self, context: ProposalContext) -> None:
        self.cache = self.model.new_cache(self.prefill.shape[0], context.tokens.shape[1])
        if self.prefill.shape[1]:
            self.model.forward(self.prefill, self.cache, logits=False)
        self.cache.select_rows(self.row_base)
        self.prefill = self.row_base = None

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.prefill is not None:
            self.row_base = self.row_base.index_select(0, rows)
        else:
            self.cache.select_rows(rows)
        self.synced = self.synced.index_select(0, rows)

    def observe(self, hidden, start, count, tokens) -> None:
        pass  # the draft runs its own forward passes

    def propose(self, context: ProposalContext, k: int) -> Proposal:
        """Feed each row's unsynced tokens [synced, num_tokens) (ragged, padded on the right with
        junk that is never attended to by valid positions and later overwritten), then draft.

        Example: synced [5, 3], num_tokens [6, 5] -> row 0 feeds position 5, row 1 positions 3, 4;
        the first draft is read at column 0 for row 0 and column 1 for row 1.
        """
        B, S = context.tokens.shape
        setup = 0.0  # the call's prompt, prefilled at its first proposal: one-off work (`Proposal.setup_seconds`)
        if self.prefill is not None:
            start = time.perf_counter()
            self._prefill(context)
            setup = time.perf_counter() - start
        rows = torch.arange(B)
        count = context.num_tokens - self.synced  # [B] >= 1
        columns = (self.synced.unsqueeze(1) + torch.arange(int(count.max()))).clamp_max(S - 1)
        feed = context.tokens.gather(1, columns).clamp_min(0)  # junk past a row's end may be PAD (-1)
        self.cache.lens = self.synced.clone()
        self.cache.grow_to(int(self.synced.max()) + int(count.max()) + k)
        read = count - 1
        tokens, probs = [], []
        for j in range(k):
            logits, _ = self.model.forward(feed, self.cache)
            self.cache.lens += read + 1
            token, q = sample_draft_token(logits[rows, read], self.model.d2t, self.target_vocab_size, context.params,
                                          context.generator, context.keys_at(j))
            tokens.append(token)
            probs.append(q)
            feed, read = token.unsqueeze(1), torch.zeros_like(read)
        self.synced = context.num_tokens.clone()
        return Proposal(tokens=torch.stack(tokens, 1), probs=None if context.params.greedy else torch.stack(probs, 1),
                        setup_seconds=setup)


def _build(setup: ProposerSetup) -> DraftModelProposer:
    """The registered (or given) draft, sharing the target's embedding where it was trained to."""
    draft = LlamaModel.from_pretrained(setup.checkpoint, fast_path=setup.target.fast_path,
                                       shared={"model.embed_tokens.weight": setup.target.embed})
    return DraftModelProposer(draft, setup.target.cfg.vocab_size)


def _vllm(setup: VLLMSetup) -> dict:
    """vLLM's draft_model method loads a full-vocabulary draft with its own weights, nothing else."""
    raw = read_config_json(setup.checkpoint)
    if raw.get("draft_vocab_size") or raw.get(SHARED_KEY):
        raise ValueError(f"the draft {setup.checkpoint} has a reduced output vocabulary or shares its target's "
                         "embedding, which vLLM's draft_model method does not load; use backend=embedded, "
                         "or a full-vocabulary draft with its own weights")
    return {"method": "draft_model", "model": str(setup.checkpoint),
            "draft_sample_method": setup.draft_sample_method}


PLUGIN = ProposerKind("draft", "a small draft model with its own KV cache", _build, checkpoint="draft",
                      vllm=_vllm, training="draft_model")
