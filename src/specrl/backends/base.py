"""The Backend protocol every rollout engine implements, and its config."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, Protocol

import torch

from specrl.engine.engine import EngineConfig
from specrl.generation import GenerateResult
from specrl.models.registry import draft_checkpoint, resolve_checkpoint
from specrl.sampling import SamplingParams
from specrl.speculation.proposer_registry import (ModelDraftChoice, ProposerChoice, speculative_tokens,
                                                   draft_kind)
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class BackendConfig(EngineConfig):
    """Which engine runs rollouts, on which checkpoint, with which speculation: the engine's settings
    (`EngineConfig`: K, adaptive, trees, max_model_len, verification) and these."""

    SECTION: ClassVar[str] = "backend"

    backend: Literal["embedded", "vllm"] = "embedded"  # embedded: specrl's PyTorch engine | vllm (docs/vllm.md)
    model: str = "tiny"  # a registered model name (tiny, smollm2-135m) or a checkpoint directory
    # none, or a kind of `specrl.speculation.proposer_registry`: ngram (prompt lookup) | suffix (sibling rollouts) |
    # draft (a draft model) | eagle3 | mtp (hidden-state heads) | int8 (the policy in int8) | hybrid
    # (`hybrid_model` or suffix per step)
    proposer: ProposerChoice = "none"
    draft: str | None = None  # checkpoint of the draft / eagle3 / mtp head; None = the model's registered one
    hybrid_model: ModelDraftChoice = "eagle3"  # the model-draft half of proposer=hybrid: draft | eagle3 | mtp
    ngram_max_n: int = within(3, "[1, inf)")  # longest tail the n-gram proposer matches
    # embedded engine: run projections through the fast path, specrl's compiled small-row matmul kernel
    # (built by `make`); false = eager PyTorch. Where the kernel cannot run, a warning says why and eager runs.
    compile: bool = True

    def __post_init__(self):
        check_fields(self)

    @property
    def speculative_tokens(self) -> int:
        """K: `num_speculative_tokens`, or the proposer's default where it is unset."""
        return speculative_tokens(self.proposer, self.num_speculative_tokens)

    @property
    def draft_kind(self) -> str | None:
        """The checkpoint kind this config's proposer loads (draft | eagle3 | mtp), or None."""
        return draft_kind(self.proposer, self.hybrid_model)


@dataclass(frozen=True)
class ModelSet:
    """A run's models, resolved once and passed down: the policy's folder, and the folder of the draft its
    proposer loads (None where it loads none: n-gram, suffix, the int8 self-draft), each with where it came
    from. Backends load these folders; none resolves a name again."""

    policy: Path
    draft: Path | None = None
    policy_source: str = ""  # e.g. "backend.model=smollm2-135m", "checkpoint step_000010"
    draft_source: str = ""


def resolve_models(config: BackendConfig) -> ModelSet:
    """The folders `config.model` and its proposer's draft (`config.draft`, else the model's registered draft of
    the kind the proposer loads) name, checked to exist."""
    draft = draft_checkpoint(config.model, config.draft_kind, config.draft)
    draft_source = "" if draft is None else \
        f"backend.draft={config.draft}" if config.draft else f"the registered {config.draft_kind} of {config.model}"
    return ModelSet(resolve_checkpoint(config.model), draft, f"backend.model={config.model}", draft_source)


class Backend(Protocol):
    name: str
    tokenizer: object
    version: int  # policy weight version stamped on every generated token

    def generate(self, prompts: list, params: SamplingParams,
                 between_steps: Callable[[], None] | None = None) -> GenerateResult:
        """Sample `params.n` responses per prompt (text or token ids). `between_steps` (the embedded
        engine only) runs after every engine step and may `sync_weights`: in-flight weight updates."""

    def sync_weights(self, policy: dict[str, torch.Tensor], version: int,
                     draft: dict[str, torch.Tensor] | None = None) -> None:
        """Load new policy (and draft) weights, Hugging Face names, and stamp `version`."""

    def proposer_state(self) -> dict:
        """What the proposer remembers across calls (JSON-ready), for checkpoints; {} when nothing."""

    def load_proposer_state(self, state: dict) -> None:
        """Restore `proposer_state()` from a checkpoint."""
