"""Online adaptation of a run's draft, by its plug-in's training recipe (`ProposerKind.training`).

    draft_model   `DraftTrainer` (`draft_adaptation`): a small draft model, soft cross-entropy against the policy
    head          `HeadTrainer` (`head_adaptation`): a hidden-state head, the training-time test on the policy's
                  own forward pass
A kind without a recipe (n-gram, suffix, the int8 self-draft) has no weights to adapt.
"""
from __future__ import annotations

from pathlib import Path

from specrl.rl.draft_adaptation import DraftAdaptConfig, DraftTrainer
from specrl.rl.head_adaptation import HeadTrainer
from specrl.sampling import SamplingParams
from specrl.speculation.proposer_registry import KINDS


# a plug-in's training recipe (`ProposerKind.training`) -> its trainer, from (kind, draft_dir, policy model,
# policy_dir, config, sampling)
RECIPES = {
    "head": lambda kind, draft_dir, model, policy_dir, config, sampling: HeadTrainer(
        draft_dir, kind, model, policy_dir, config, sampling),
    "draft_model": lambda kind, draft_dir, model, policy_dir, config, sampling: DraftTrainer(
        draft_dir, config, sampling.temperature),
}


def draft_trainer(kind: str, draft_dir: str | Path, policy_model, policy_dir: str | Path, config: DraftAdaptConfig,
                  sampling: SamplingParams) -> DraftTrainer | HeadTrainer:
    """The trainer that adapts the `kind` draft in `draft_dir` during RL, by the kind's recipe."""
    recipe = KINDS[kind].training
    if recipe is None:
        raise ValueError(f"draft.enabled: the {kind} proposer has no trained weights to adapt; set draft.enabled=false")
    return RECIPES[recipe](kind, draft_dir, policy_model, policy_dir, config, sampling)
