"""Drafter catalogue: what proposing K draft tokens costs.

Every drafter is priced the same way: K sequential forwards of a small network
(`draft_network`), each over one token per live sequence, through the same cost
model as the target. A drafter without a network (n-gram, suffix tree) costs no
device time, only `host_s_per_seq` of CPU work per sequence per iteration.

Draft networks, derived from the target's shape:
  eagle3     one dense decoder layer at the target's width, a 3*hidden -> hidden
             fusion FC, and an LM head over a reduced draft vocabulary (32k).
  eagle      (EAGLE-1/2) one decoder layer, a 2*hidden -> hidden FC and the target's
             full LM head (the SpecDecode-Bench vLLM drafter).
  mtp        one decoder layer of the target's own kind (MoE if the target is MoE),
             a 2*hidden -> hidden projection and the target's full LM head.
  draft:NAME an external catalogue model (e.g. draft:qwen3-0.6b, draft:tiny-draft).
  ngram, suffix   host-side lookups, no device work.

What is ignored: the first draft forward's extra tokens (EAGLE re-encodes the
accepted tokens), tree drafting (chains only), and the draft's KV writes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specrl.sim.models import ModelSpec, get_model

DRAFT_VOCAB = 32000


@dataclass(frozen=True)
class Drafter:
    """A proposer as the cost model sees it.

    name: catalogue name.
    network: the small model run K times per iteration, or None (host-side drafting).
    host_s_per_seq: host seconds per live sequence per iteration (n-gram lookups).
    shares_target_layout: the network is sharded like the target (EAGLE/MTP live
        inside the target's engine); an external model runs on the same devices too.
    """

    name: str
    network: ModelSpec | None
    host_s_per_seq: float = 0.0
    shares_target_layout: bool = True


def eagle3_network(target: ModelSpec) -> ModelSpec:
    """EAGLE-3 head: 1 dense layer (FFN = target FFN, or 3*hidden for MoE targets), fusion FC, 32k LM head."""
    ffn = target.ffn if not target.is_moe else 3 * target.hidden
    return ModelSpec(
        f"eagle3({target.name})", 1, target.hidden, target.heads, max(target.kv_heads, 1), target.head_dim,
        ffn, min(DRAFT_VOCAB, target.vocab), extra_params=3 * target.hidden * target.hidden,
    )


def eagle_network(target: ModelSpec) -> ModelSpec:
    """EAGLE-1/2 head: 1 dense layer, 2*hidden -> hidden FC, the target's full-vocabulary LM head."""
    ffn = target.ffn if not target.is_moe else 3 * target.hidden
    return ModelSpec(
        f"eagle({target.name})", 1, target.hidden, target.heads, max(target.kv_heads, 1), target.head_dim,
        ffn, target.vocab, extra_params=2 * target.hidden * target.hidden,
    )


def mtp_network(target: ModelSpec) -> ModelSpec:
    """MTP module: one layer of the target's own kind plus a 2*hidden -> hidden projection and the full LM head."""
    return replace(
        target, name=f"mtp({target.name})", layers=1, dense_layers=0,
        extra_params=2 * target.hidden * target.hidden,
    )


NETWORKS = {"eagle3": eagle3_network, "eagle": eagle_network, "mtp": mtp_network}  # drafters with a network
HOST_ONLY = ("ngram", "suffix")  # host-side lookups


def get_drafter(name: str, target: ModelSpec) -> Drafter:
    """Build the drafter `name` for `target` (see the module docstring for names)."""
    if name in NETWORKS:
        return Drafter(name, NETWORKS[name](target))
    if name in HOST_ONLY:
        return Drafter(name, None, host_s_per_seq=0.0)
    if name.startswith("draft:"):
        return Drafter(name, get_model(name.split(":", 1)[1]))
    raise ValueError(f"unknown drafter {name!r}; known: eagle3, eagle, mtp, ngram, suffix, draft:MODEL")


DRAFTER_NAMES = ("eagle3", "eagle", "mtp", "ngram", "suffix", "draft:MODEL")
