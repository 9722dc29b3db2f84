"""Drafting with a hidden-state head (EAGLE-3 or MTP) inside the engine's loop.

The head keeps its own one-layer KV cache in step with the target through `observe`,
which the engine calls after every target forward (the prompt prefill included) with the
target's hidden states of the positions it just verified:

    observe(hidden, start, count, tokens)
        hidden {layer: [B, T, H]}, row b valid for t < count[b], at positions start[b] + t;
        the head runs chain element 1 there (features fused from `hidden`, next tokens
        tokens[b, start[b] + t + 1]), writing its cache; the output at the last valid
        position anchors the next proposal.

    propose(context, k)
        element 1's distribution is already known from observe; elements 2..k each run the
        head once more on its own output g and the token just drafted. Draft cache entries
        past the anchor are overwritten by the next observe, which restarts at the anchor's
        successor, so nothing is rolled back by hand.

Drafts are sampled from q = the head's distribution under the call's sampling params
(argmax at temperature 0, where q is one-hot and omitted).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from specrl.engine.kv_cache import KVCache
from specrl.engine.model import LlamaModel
from specrl.engine.sampling import SamplingParams, sampling_distribution
from specrl.spec.draft_head import DraftHead
from specrl.spec.eagle3 import Eagle3Head
from specrl.spec.mtp import MTPHead
from specrl.spec.proposer import Proposal, ProposalContext, to_target_vocab

HEAD_KINDS = {"eagle3": Eagle3Head, "mtp": MTPHead}


def load_head(head_dir: str | Path, target: LlamaModel, kind: str | None = None) -> DraftHead:
    """Load a saved head for `target`; mismatched kind, vocabulary or width is an error that names it."""
    head_dir = Path(head_dir)
    path = head_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{head_dir}: no config.json (not a draft head checkpoint)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    saved = raw.get("specrl_head") or ("eagle3" if "Eagle3" in "".join(raw.get("architectures") or []) else None)
    if saved not in HEAD_KINDS:
        raise ValueError(f"{head_dir}: not an EAGLE-3 or MTP head (architectures={raw.get('architectures')})")
    if kind is not None and saved != kind:
        raise ValueError(f"{head_dir}: is a {saved} head, but proposer={kind} was asked for")
    tc = target.cfg
    if raw.get("vocab_size") != tc.vocab_size:
        raise ValueError(f"draft/target vocabulary mismatch: head {head_dir} has vocab_size {raw.get('vocab_size')}, "
                         f"target {target.source} has {tc.vocab_size}")
    if raw.get("hidden_size") != tc.hidden_size:
        raise ValueError(f"{head_dir}: head hidden_size {raw.get('hidden_size')} != target's {tc.hidden_size}")
    head = HEAD_KINDS[saved].load(head_dir, raw, target)
    head.eval()
    return head


class HeadProposer:
    def __init__(self, head: DraftHead):
        self.head = head
        self.name = head.kind
        self.hidden_layers = head.hidden_layers
        self.cache: KVCache | None = None
        self.feature: torch.Tensor | None = None  # [B, H] g at each row's anchor

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        self.cache = self.head.new_cache(tokens.shape[0], tokens.shape[1])
        self.feature = torch.zeros(tokens.shape[0], self.head.cfg.hidden_size)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.select_rows(rows)
        self.feature = self.feature.index_select(0, rows)

    @torch.inference_mode()
    def observe(self, hidden: dict[int, torch.Tensor], start: torch.Tensor, count: torch.Tensor,
                tokens: torch.Tensor) -> None:
        T = next(iter(hidden.values())).shape[1]
        if T == 0:
            return
        positions = start.unsqueeze(1) + 1 + torch.arange(T).unsqueeze(0)  # [B, T] of the next tokens
        next_tokens = tokens.gather(1, positions.clamp_max(tokens.shape[1] - 1)).clamp_min(0)  # junk may be PAD (-1)
        self.cache.lens = start.clone()
        g = self.head.forward_cached(self.head.fuse(hidden), next_tokens, self.cache)  # [B, T, H]
        has = count > 0
        last = (count - 1).clamp_min(0)
        self.feature = torch.where(has.unsqueeze(1), g[torch.arange(g.shape[0]), last], self.feature)
        self.cache.lens = start + count

    @torch.inference_mode()
    def propose(self, context: ProposalContext, k: int) -> Proposal:
        params, head = context.params, self.head
        feature, tokens, probs = self.feature, [], []
        for j in range(k):
            if j:
                feature = head.forward_cached(feature.unsqueeze(1), tokens[-1].unsqueeze(1), self.cache)[:, 0]
                self.cache.lens += 1
            q, _ = sampling_distribution(head.logits(feature), params)
            q = to_target_vocab(q, head.d2t, context.vocab_size)
            token = q.argmax(-1) if params.greedy else torch.multinomial(q, 1, generator=context.generator).squeeze(1)
            tokens.append(token)
            probs.append(q)
        return Proposal(tokens=torch.stack(tokens, 1), probs=None if params.greedy else torch.stack(probs, 1))
