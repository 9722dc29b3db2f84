"""A hybrid proposer: per step, a model draft or the group-suffix draft, whichever pays more;
and within a model-draft step, each row whose suffix lookup found all k tokens takes them.

For a step with k drafts over B rows, part i is expected to yield

    rate_i = mean over rows (1 + E_i,b) / (V + c_i)      E(k) = sum_{j<k} P(drafts 0..j all accepted)

tokens per second, where V is the engine's last measured step time outside the proposer (target
forward, verification, bookkeeping: `ProposalContext.verify_seconds`) and c_i is part i's own
propose() time, a moving average of what drafting costs a step (a proposal's one-off
`setup_seconds`, the call's prompt, left out). A suffix row b expects E_suffix(min(k, f_b)) for the
f_b tokens its lookup found (the padding after them is a guess, expected to add nothing); in a model
step a row whose lookup found all k takes the suffix draft, the others the model's E_model(k). So a
step whose lookups found nothing goes to the model whenever the model pays at all. The suffix
draft is free but only as good as the siblings' agreement; the model draft costs a pass per
drafted token.

Acceptance estimates come from the tokens the engine actually emitted, read at the next
call. A rejected draft token x had q(x) > p(x), so the residual (p - q)+ is zero at x and
the recovered token differs from it: a row's leading matches between its drafts and its
emitted tokens are exactly its accepted drafts. The suffix draft is deterministic, so its
chance of matching a target sample equals its acceptance probability: it is scored on every
step, whichever part ran, on the positions its lookup found (positions past a row's emitted
tokens are left out too). The model part is scored on the rows where its draft ran, and runs at
least every `explore_every` steps.

Mixing rows keeps the step exact: each row's draft is verified against the distribution it
came from (the model's q, or one-hot for a suffix row; `verify` takes q per row).
"""
from __future__ import annotations

import time

import torch

from specrl.sampling import SamplingParams
from specrl.speculation.acceptance import AcceptanceEstimate
from specrl.speculation.planner import best_option
from specrl.speculation.plugin import ProposerKind
from specrl.speculation.proposer import Proposal, ProposalContext, one_hot_proposal
from specrl.speculation.suffix import SuffixProposer


def observe_matches(estimate: AcceptanceEstimate, drafts: torch.Tensor, emitted: torch.Tensor,
                    known: torch.Tensor) -> None:
    """Score drafts [B, k] against the tokens emitted after them [B, k], of which a row's first `known`
    [B] exist: position j's trials are the rows that matched 0..j-1 and have a token at j.

    Example: drafts [[1, 2, 3], [1, 5, 3]], emitted [[1, 2, 9], [1, 2, 3]], known [3, 1]
        -> position 0: 2 trials, 2 matched; position 1: row 0, matched; position 2: row 0, not matched.
    """
    matches = (drafts == emitted).long().cumprod(1)  # [B, k] 1 while all drafts so far matched
    reached = torch.cat([torch.ones_like(matches[:, :1]), matches[:, :-1]], dim=1)
    seen = known.unsqueeze(1) > torch.arange(drafts.shape[1])  # [B, k]
    estimate.observe((reached * seen).sum(0).tolist(), (matches * seen).sum(0).tolist())


class HybridProposer:
    name = "hybrid"
    max_width = 1  # chains only

    def __init__(self, model_part, suffix_part: SuffixProposer | None = None, max_k: int = 8,
                 smoothing: float = 0.1, explore_every: int = 16):
        self.model_part, self.suffix_part = model_part, suffix_part or SuffixProposer()
        self.hidden_layers = model_part.hidden_layers
        # priors held with the weight of 1 / smoothing rows (as the planner's): one row's first draft decides nothing
        self.estimates = {"model": AcceptanceEstimate(max_k, 0.5, smoothing, 1 / smoothing),
                          "suffix": AcceptanceEstimate(max_k, 0.3, smoothing, 1 / smoothing)}
        self.cost = {"model": None, "suffix": 0.0}  # seconds per propose(), moving averages
        self.smoothing, self.explore_every = smoothing, explore_every

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        self.model_part.start(tokens, num_tokens, params)
        self.suffix_part.start(tokens, num_tokens, params)
        # last call's (part, drafts [B, k], positions to score per row [B])
        self.pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self.pending_start: torch.Tensor | None = None  # [B] num_tokens when they were proposed
        self.since_model = 0

    def select_rows(self, rows: torch.Tensor) -> None:
        self.model_part.select_rows(rows)
        self.suffix_part.select_rows(rows)
        if self.pending_start is not None:
            self.pending = [(part, drafts.index_select(0, rows), scored.index_select(0, rows))
                            for part, drafts, scored in self.pending]
            self.pending_start = self.pending_start.index_select(0, rows)

    def observe(self, hidden, start, count, tokens) -> None:
        self.model_part.observe(hidden, start, count, tokens)

    def restart(self, tokens, num_tokens, params, hidden) -> None:
        self.model_part.restart(tokens, num_tokens, params, hidden)  # the suffix part reads tokens only

    def state_dict(self) -> dict:
        return {"suffix": self.suffix_part.state_dict(), "model": self.model_part.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.suffix_part.load_state_dict(state.get("suffix", {}))
        self.model_part.load_state_dict(state.get("model", {}))

    def check_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        self.model_part.check_draft_weights(state, source)

    def load_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        self.model_part.load_draft_weights(state, source)

    def _score_pending(self, context: ProposalContext) -> None:
        """Compare last call's drafts with the tokens that were emitted after them."""
        if self.pending_start is None:
            return
        k = self.pending[0][1].shape[1]
        columns = (self.pending_start.unsqueeze(1) + torch.arange(k)).clamp_max(context.tokens.shape[1] - 1)
        emitted = context.tokens.gather(1, columns)
        known = (context.num_tokens - self.pending_start).clamp(0, k)
        for part, drafts, scored in self.pending:
            observe_matches(self.estimates[part], drafts, emitted, torch.minimum(known, scored))
        self.pending, self.pending_start = [], None

    def _timed(self, part: str, call):
        """call(), its seconds (less a proposal's one-off `setup_seconds`) into the part's cost average."""
        start = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - start - (result.setup_seconds if isinstance(result, Proposal) else 0.0)
        previous = self.cost[part]
        self.cost[part] = seconds if previous is None else previous + self.smoothing * (seconds - previous)
        return result

    def choose(self, k: int, verify_seconds: float | None, found: torch.Tensor) -> str:
        """"model" or "suffix": the larger expected tokens per second (the model until its cost is known), where
        found [B] is how many of the k tokens each row's suffix lookup found."""
        if self.cost["model"] is None or verify_seconds is None or self.since_model >= self.explore_every:
            return "model"
        suffix = torch.tensor([self.estimates["suffix"].expected(j) for j in range(k + 1)])[found.clamp_max(k)]
        model = torch.where(found >= k, suffix, self.estimates["model"].expected(k))
        parts = ("model", "suffix")
        return parts[best_option([1.0 + float(model.mean()), 1.0 + float(suffix.mean())],
                                 [verify_seconds + self.cost[part] for part in parts])]

    def propose(self, context: ProposalContext, k: int) -> Proposal:
        self._score_pending(context)
        found, last = self._timed("suffix", lambda: self.suffix_part.lookup(context, k))
        suffix = one_hot_proposal(found, last, k)
        found_count = torch.tensor([len(f) for f in found], dtype=torch.long)  # [B]
        self.pending = [("suffix", suffix.tokens, found_count)]  # (part, drafts [B, k], positions to score [B])
        self.pending_start = context.num_tokens.clone()
        part = self.choose(k, context.verify_seconds, found_count)
        if part == "suffix":
            self.since_model += 1
            return suffix
        self.since_model = 0
        model = self._timed("model", lambda: self.model_part.propose(context, k))
        full = found_count >= k  # [B] rows whose siblings supply all k tokens
        self.pending.append(("model", model.tokens, torch.where(full, 0, k)))
        if not full.any():
            return model
        tokens = torch.where(full.unsqueeze(1), suffix.tokens, model.tokens)
        probs = None
        if model.probs is not None:  # a suffix row's q is one-hot on its drafts
            one_hot = torch.nn.functional.one_hot(suffix.tokens, model.probs.shape[-1]).to(model.probs.dtype)
            probs = torch.where(full.view(-1, 1, 1), one_hot, model.probs)
        return Proposal(tokens=tokens, probs=probs, setup_seconds=model.setup_seconds)


PLUGIN = ProposerKind(
    "hybrid", "per step, a model draft (hybrid_model) or the suffix draft, whichever pays more",
    lambda s: HybridProposer(s.model_part, max_k=s.num_speculative_tokens), vllm_refusal="vLLM has no hybrid proposer",
    wraps_model_draft=True)
