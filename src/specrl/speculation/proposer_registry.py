"""The proposer kinds: the one place that lists them. Each is a plug-in (`plugin.ProposerKind`) defined in
its family's own module, which owns what it needs and who serves it; this registry maps kind -> plug-in.

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
the benches and draft training; none of them asks which kind a proposer is, only what its plug-in
says, and the model registry names a target's draft of a kind `<target>-<kind>` without a list of
its own. Adding a family: its module with a `PLUGIN`, and one line in `KINDS` below.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from specrl.models.checkpoint import read_config_json
from specrl.models.llama import LlamaModel
from specrl.speculation import draft_model, eagle3, hybrid, int8_draft, mtp, ngram, suffix
from specrl.speculation.draft_head import DraftHead, saved_head_kind
from specrl.speculation.plugin import ProposerKind, ProposerSetup
from specrl.speculation.proposer import Proposer

KINDS: dict[str, ProposerKind] = {plugin.name: plugin for plugin in (
    ngram.PLUGIN,
    suffix.PLUGIN,
    draft_model.PLUGIN,
    eagle3.PLUGIN,
    mtp.PLUGIN,
    int8_draft.PLUGIN,
    hybrid.PLUGIN,
)}

PROPOSER_NAMES = tuple(KINDS)
PROPOSER_CHOICES = ("none", *PROPOSER_NAMES)
ProposerChoice = Literal[PROPOSER_CHOICES]  # type: ignore[valid-type]
MODEL_DRAFTS = tuple(kind.name for kind in KINDS.values() if kind.checkpoint)  # kinds that load a checkpoint
ModelDraftChoice = Literal[MODEL_DRAFTS]  # type: ignore[valid-type]
HEAD_KINDS = {kind.name: kind.head for kind in KINDS.values() if kind.head is not None}


def draft_kind(proposer: str, hybrid_model: str) -> str | None:
    """The checkpoint kind a proposer loads (the hybrid's is its model part's), or None."""
    if proposer not in KINDS:
        return None
    return hybrid_model if KINDS[proposer].wraps_model_draft else KINDS[proposer].checkpoint


def speculative_tokens(proposer: str, k: int | None = None) -> int:
    """K: `k` (a config's num_speculative_tokens) where set, else the kind's `default_k` (0 for none)."""
    if k is not None:
        return k
    return KINDS[proposer].default_k if proposer in KINDS else 0


def build_proposer(proposer: str, target: LlamaModel, checkpoint: Path | None, num_speculative_tokens: int,
                   ngram_max_n: int, hybrid_model: str) -> Proposer | None:
    """The proposer `proposer` names for the embedded engine (None for "none"); `checkpoint` is the
    folder `models.registry.draft_checkpoint` resolved for it."""
    if proposer == "none":
        return None
    setup = ProposerSetup(target, checkpoint, num_speculative_tokens, ngram_max_n)
    if KINDS[proposer].wraps_model_draft:
        setup = dataclasses.replace(setup, model_part=KINDS[hybrid_model].build(setup))
    return KINDS[proposer].build(setup)


def load_head(head_dir: str | Path, target: LlamaModel, kind: str | None = None) -> DraftHead:
    """Load a saved EAGLE-3 or MTP head for `target` (of `kind`, or whichever its config declares); a
    mismatched kind, vocabulary or width is an error that names it."""
    raw = read_config_json(Path(head_dir))
    wanted = kind or saved_head_kind(raw)
    if wanted not in HEAD_KINDS:
        raise ValueError(f"{head_dir}: not an EAGLE-3 or MTP head (architectures={raw.get('architectures')})")
    return HEAD_KINDS[wanted].load_checked(head_dir, target)
