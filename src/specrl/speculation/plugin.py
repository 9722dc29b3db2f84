"""A draft family as one plug-in: everything specrl does with a kind of proposer, in one object.

A `ProposerKind` owns a family's whole life; nothing outside the plug-ins and the registry that lists
them (`proposer_registry`) asks which kind or class a proposer is:

    build          its proposer for the embedded engine, from a `ProposerSetup`
    checkpoint     the registered checkpoint kind it loads (draft | eagle3 | mtp), or None (n-gram,
                   suffix, the int8 self-draft)
    vllm           its keys of vLLM's `speculative_config`, or None and `vllm_refusal`, the reason
    refit          on a weight sync, the proposer's own `check_draft_weights` / `load_draft_weights`
                   (the `Proposer` protocol): a draft model or head takes trained weights, the others
                   refuse them, and the int8 self-draft rebuilds itself from the policy
    training       its offline recipe and online adaptation, by name: "draft_model" (distillation into
                   a small model) or "head" (a hidden-state head); None for drafts that are not trained
    default_k      K where a config leaves it unset
    head           a hidden-state head's class (it drafts trees, and its checkpoints load through it)
    wraps_model_draft  it drafts with another kind's proposer, chosen per run (the hybrid's `hybrid_model`),
                   built first and handed over as `ProposerSetup.model_part`

Each family's module defines its `PLUGIN`, and the registry lists them: adding a family is one module
plus one registry line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal

from specrl.models.llama import LlamaModel

if TYPE_CHECKING:
    from specrl.speculation.draft_head import DraftHead
    from specrl.speculation.proposer import Proposer


@dataclass(frozen=True)
class ProposerSetup:
    """What a proposer is built from."""

    target: LlamaModel
    checkpoint: Path | None  # the draft model's or head's folder, for kinds that load one
    num_speculative_tokens: int
    ngram_max_n: int
    model_part: Proposer | None = None  # hybrid: its model-draft half, already built


@dataclass(frozen=True)
class VLLMSetup:
    """What a family's vLLM `speculative_config` keys are made from."""

    checkpoint: Path | None  # as in ProposerSetup
    ngram_max_n: int
    draft_sample_method: str  # VLLMOptions.draft_sample_method: greedy | probabilistic


@dataclass(frozen=True)
class ProposerKind:
    name: str
    summary: str  # one line for --help and docs
    build: Callable[[ProposerSetup], Proposer]
    checkpoint: str | None = None
    vllm: Callable[[VLLMSetup], dict] | None = None  # speculative_config keys ("method" and its own)
    vllm_refusal: str = ""  # why vLLM cannot serve it (where vllm is None)
    training: Literal["draft_model", "head"] | None = None
    default_k: int = 3
    head: type[DraftHead] | None = None
    wraps_model_draft: bool = False  # drafts with a model-draft kind's proposer (the hybrid): its checkpoint too

    @property
    def drafts_trees(self) -> bool:
        """Whether its proposer drafts trees (the hidden-state heads do)."""
        return self.head is not None
