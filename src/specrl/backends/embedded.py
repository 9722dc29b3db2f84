"""The embedded backend: specrl's own PyTorch engine, in process."""
from __future__ import annotations

from collections.abc import Callable

import torch

from specrl.backends.base import BackendConfig, ModelSet, resolve_models
from specrl.engine.engine import RolloutEngine
from specrl.generation import GenerateResult
from specrl.models.checkpoint import load_tokenizer
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.proposer_registry import build_proposer


class EmbeddedBackend:
    name = "embedded"

    def __init__(self, config: BackendConfig, models: ModelSet | None = None):
        self.config = config
        models = models or resolve_models(config)
        self.tokenizer = load_tokenizer(models.policy)
        model = LlamaModel.from_pretrained(models.policy, fast_path=config.compile)
        self.proposer = build_proposer(config.proposer, model, models.draft, config.speculative_tokens,
                                       config.ngram_max_n, config.hybrid_model)
        self.engine = RolloutEngine(model, self.tokenizer, self.proposer, config)  # a BackendConfig is an EngineConfig

    @property
    def version(self) -> int:
        return self.engine.version

    @version.setter
    def version(self, version: int) -> None:
        self.engine.version = version

    def proposer_state(self) -> dict:
        return self.proposer.state_dict() if self.proposer is not None else {}

    def load_proposer_state(self, state: dict) -> None:
        if self.proposer is not None:
            self.proposer.load_state_dict(state)
        elif state:
            raise ValueError("a checkpoint holds proposer state, but this backend runs without speculation")

    def generate(self, prompts: list, params: SamplingParams,
                 between_steps: Callable[[], None] | None = None) -> GenerateResult:
        return self.engine.generate(prompts, params, between_steps)

    def sync_weights(self, policy: dict[str, torch.Tensor], version: int,
                     draft: dict[str, torch.Tensor] | None = None) -> None:
        source = f"draft weights of version {version}"
        if draft is not None:  # checked before the policy is replaced, so a refusal leaves both as they were
            if self.proposer is None:
                raise ValueError(f"{source} were sent, but this backend runs without speculation")
            self.proposer.check_draft_weights(draft, source)
        self.engine.load_weights(policy, version)
        if draft is not None:
            self.proposer.load_draft_weights(draft, source)
