"""The Backend protocol every rollout engine implements, and its config."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from specrl.engine.engine import GenerateResult
from specrl.engine.sampling import SamplingParams


@dataclass(frozen=True)
class BackendConfig:
    """Which engine runs rollouts, on which checkpoint, with which speculation."""

    BACKENDS: ClassVar[tuple[str, ...]] = ("embedded", "vllm")
    PROPOSERS: ClassVar[tuple[str, ...]] = ("none", "ngram", "suffix", "draft", "eagle3", "mtp", "hybrid")
    MODEL_DRAFTS: ClassVar[tuple[str, ...]] = ("draft", "eagle3", "mtp")

    backend: str = "embedded"  # embedded | vllm
    model: str = "tiny"  # a registered model name (tiny, smollm2-135m) or a checkpoint directory
    # none | ngram (prompt lookup) | suffix (sibling rollouts) | draft (a draft model) | eagle3 | mtp
    # (hidden-state heads) | hybrid (per step, `hybrid_model` or suffix, whichever pays more)
    proposer: str = "none"
    draft: str | None = None  # checkpoint of the draft / eagle3 / mtp head; None = the model's registered one
    hybrid_model: str = "eagle3"  # the model-draft half of proposer=hybrid: draft | eagle3 | mtp
    num_speculative_tokens: int = 3  # K, the most drafts verified per step
    adaptive: bool = True  # choose K per step (0 = off) from the live batch and measured acceptance and cost
    max_model_len: int | None = None  # prompt + response cap; None = the model's context
    ngram_max_n: int = 3  # longest tail the n-gram proposer matches

    def __post_init__(self):
        if self.backend not in self.BACKENDS:
            raise ValueError(f"backend must be one of {self.BACKENDS}, got {self.backend!r}")
        if self.proposer not in self.PROPOSERS:
            raise ValueError(f"proposer must be one of {self.PROPOSERS}, got {self.proposer!r}")
        if self.hybrid_model not in self.MODEL_DRAFTS:
            raise ValueError(f"hybrid_model must be one of {self.MODEL_DRAFTS}, got {self.hybrid_model!r}")
        if self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens (K) must be >= 0, got {self.num_speculative_tokens}")


    @property
    def model_draft(self) -> str | None:
        """The kind of model draft this config loads (draft | eagle3 | mtp), or None."""
        if self.proposer == "hybrid":
            return self.hybrid_model
        return self.proposer if self.proposer in self.MODEL_DRAFTS else None


class Backend(Protocol):
    name: str
    tokenizer: object
    version: int  # policy weight version stamped on every generated token

    def generate(self, prompts: list, params: SamplingParams) -> GenerateResult:
        """Sample `params.n` responses per prompt (text or token ids)."""

    def sync_weights(self, policy: dict[str, torch.Tensor], version: int,
                     draft: dict[str, torch.Tensor] | None = None) -> None:
        """Load new policy (and draft) weights, Hugging Face names, and stamp `version`."""
