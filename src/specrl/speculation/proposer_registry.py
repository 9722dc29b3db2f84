"""The proposer kinds: the one place that lists them, what each needs and who serves it.

    name     drafts from                                      checkpoint      vLLM method
    ngram    the row's own history (prompt lookup)            -               ngram
    suffix   sibling rollouts of the same prompt (and the     -               (refused)
             prompt's rollouts in earlier calls)
    draft    a small draft model                              draft           draft_model
    eagle3   an EAGLE-3 head on the target's hidden states    eagle3          eagle3
    mtp      an MTP head on the target's last hidden state    mtp             mtp (specrl's model class)
    hybrid   per step, a model draft or the suffix draft      its model part  (refused)
    int8     the policy itself, weights rounded to int8,      -               (refused)
             rebuilt at every weight sync

`none` (no speculation) is not a proposer; `PROPOSER_CHOICES` adds it for configs and CLIs.
Everything that names proposers reads this module: `BackendConfig`'s choices, both backends,
the benches and draft training; the model registry keeps its own list of the kinds that load a
checkpoint (`DRAFT_CHECKPOINTS`, which models sit below speculation to own), checked against this one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from specrl.models.checkpoint import read_config_json
from specrl.models.llama import LlamaModel
from specrl.models.registry import DRAFT_CHECKPOINTS
from specrl.speculation.draft_head import DraftHead
from specrl.speculation.draft_model import DraftModelProposer
from specrl.speculation.eagle3 import Eagle3Head
from specrl.speculation.head_proposer import HeadProposer
from specrl.speculation.hybrid import HybridProposer
from specrl.speculation.int8_draft import Int8DraftProposer
from specrl.speculation.mtp import MTPHead
from specrl.speculation.ngram import NgramConfig, NgramProposer
from specrl.speculation.proposer import Proposer
from specrl.speculation.suffix import SuffixProposer


@dataclass(frozen=True)
class ProposerSetup:
    """What a proposer is built from."""

    target: LlamaModel
    checkpoint: Path | None  # the draft model's or head's folder, for kinds that load one
    num_speculative_tokens: int
    ngram_max_n: int
    model_part: Proposer | None = None  # hybrid: its model-draft half, already built


@dataclass(frozen=True)
class ProposerKind:
    name: str
    summary: str  # one line for --help and docs
    build: Callable[[ProposerSetup], Proposer]
    checkpoint: str | None = None  # the registered checkpoint kind it loads (draft | eagle3 | mtp), if any
    head: type[DraftHead] | None = None  # the head class of a hidden-state head kind
    vllm_method: str | None = None  # vLLM's speculative_config method; None = not served by vLLM
    vllm_refusal: str = ""  # why vLLM cannot serve it
    default_k: int = 3  # num_speculative_tokens when a config leaves it unset: the most drafts per step


def _head_proposer(kind: str) -> Callable[[ProposerSetup], Proposer]:
    return lambda setup: HeadProposer(load_head(setup.checkpoint, setup.target, kind))


KINDS: dict[str, ProposerKind] = {kind.name: kind for kind in (
    ProposerKind("ngram", "prompt lookup: what followed the latest match of the row's tail",
                 lambda s: NgramProposer(NgramConfig(max_n=s.ngram_max_n)), vllm_method="ngram"),
    ProposerKind("suffix", "sibling rollouts of the same prompt (the GRPO group) and its earlier rollouts",
                 lambda s: SuffixProposer(), vllm_refusal="vLLM has no group-suffix (sibling rollout) proposer"),
    ProposerKind("draft", "a small draft model with its own KV cache",
                 lambda s: DraftModelProposer(LlamaModel.from_pretrained(
                     s.checkpoint, fast_path=s.target.fast_path, shared={"model.embed_tokens.weight": s.target.embed}),
                     s.target.cfg.vocab_size),
                 checkpoint="draft", vllm_method="draft_model"),
    ProposerKind("eagle3", "an EAGLE-3 head on the target's low, middle and high hidden states",
                 _head_proposer("eagle3"), checkpoint="eagle3", head=Eagle3Head, vllm_method="eagle3"),
    ProposerKind("mtp", "a DeepSeek-V3-style MTP head on the target's last hidden state",
                 _head_proposer("mtp"), checkpoint="mtp", head=MTPHead, vllm_method="mtp"),
    ProposerKind("int8", "the policy itself with int8 weights, rebuilt at every weight sync (no training)",
                 lambda s: Int8DraftProposer(s.target), default_k=8,  # accepted ~0.97 per token: long chains pay
                 vllm_refusal="vLLM has no int8 self-draft (a quantized copy of the policy as its own draft)"),
    ProposerKind("hybrid", "per step, a model draft (hybrid_model) or the suffix draft, whichever pays more",
                 lambda s: HybridProposer(s.model_part, max_k=s.num_speculative_tokens),
                 vllm_refusal="vLLM has no hybrid proposer"),
)}

PROPOSER_NAMES = tuple(KINDS)
PROPOSER_CHOICES = ("none", *PROPOSER_NAMES)
ProposerChoice = Literal[PROPOSER_CHOICES]  # type: ignore[valid-type]
MODEL_DRAFTS = tuple(kind.name for kind in KINDS.values() if kind.checkpoint)  # kinds that load a checkpoint
if set(MODEL_DRAFTS) != set(DRAFT_CHECKPOINTS):  # the model registry names each target's drafts by these kinds
    raise ImportError(f"proposer kinds that load a checkpoint {MODEL_DRAFTS} != models.registry.DRAFT_CHECKPOINTS "
                      f"{DRAFT_CHECKPOINTS}: change both together")
ModelDraftChoice = Literal[MODEL_DRAFTS]  # type: ignore[valid-type]
HEAD_KINDS = {kind.name: kind.head for kind in KINDS.values() if kind.head is not None}


def draft_kind(proposer: str, hybrid_model: str) -> str | None:
    """The checkpoint kind a proposer loads (the hybrid's is its model part's), or None."""
    return hybrid_model if proposer == "hybrid" else KINDS[proposer].checkpoint if proposer in KINDS else None


def default_speculative_tokens(proposer: str) -> int:
    """K for a config that leaves num_speculative_tokens unset: the kind's `default_k` (0 for none)."""
    return KINDS[proposer].default_k if proposer in KINDS else 0


def build_proposer(proposer: str, target: LlamaModel, checkpoint: Path | None, num_speculative_tokens: int,
                   ngram_max_n: int, hybrid_model: str) -> Proposer | None:
    """The proposer `proposer` names for the embedded engine (None for "none"); `checkpoint` is the
    folder `models.registry.draft_checkpoint` resolved for it."""
    if proposer == "none":
        return None
    setup = ProposerSetup(target, checkpoint, num_speculative_tokens, ngram_max_n)
    if proposer == "hybrid":
        setup = ProposerSetup(target, checkpoint, num_speculative_tokens, ngram_max_n,
                              model_part=KINDS[hybrid_model].build(setup))
    return KINDS[proposer].build(setup)


def load_head(head_dir: str | Path, target: LlamaModel, kind: str | None = None) -> DraftHead:
    """Load a saved EAGLE-3 or MTP head for `target`; a mismatched kind, vocabulary or width is an
    error that names it."""
    head_dir = Path(head_dir)
    raw = read_config_json(head_dir)
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
