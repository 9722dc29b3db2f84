"""The embedded backend: specrl's own PyTorch engine, in process."""
from __future__ import annotations

import torch
from transformers import AutoTokenizer

from specrl.backends.base import BackendConfig
from specrl.engine.engine import EngineConfig, GenerateResult, RolloutEngine
from specrl.engine.model import LlamaModel
from specrl.engine.sampling import SamplingParams
from specrl.models.registry import draft_for, resolve_checkpoint
from specrl.spec.draft_model import DraftModelProposer
from specrl.spec.head_proposer import HeadProposer, load_head
from specrl.spec.hybrid import HybridProposer
from specrl.spec.ngram import NgramConfig, NgramProposer
from specrl.spec.suffix import SuffixProposer


def load_tokenizer(checkpoint_dir):
    """The checkpoint's own tokenizer, offline, never running checkpoint code."""
    try:
        return AutoTokenizer.from_pretrained(str(checkpoint_dir), trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"{checkpoint_dir}: cannot load its tokenizer ({err})") from err


class EmbeddedBackend:
    name = "embedded"

    def __init__(self, config: BackendConfig):
        self.config = config
        target_dir = resolve_checkpoint(config.model)
        self.tokenizer = load_tokenizer(target_dir)
        model = LlamaModel.from_pretrained(target_dir)
        self.proposer = self._make_proposer(config, model)
        engine_config = EngineConfig(num_speculative_tokens=config.num_speculative_tokens,
                                     adaptive=config.adaptive, max_model_len=config.max_model_len)
        self.engine = RolloutEngine(model, self.tokenizer, self.proposer, engine_config)

    @staticmethod
    def _make_proposer(config: BackendConfig, model: LlamaModel):
        if config.proposer == "none":
            return None
        if config.proposer == "ngram":
            return NgramProposer(NgramConfig(max_n=config.ngram_max_n))
        if config.proposer == "suffix":
            return SuffixProposer()
        kind = config.model_draft
        draft_name = config.draft or draft_for(config.model, kind)
        if draft_name is None:
            raise ValueError(f"proposer={config.proposer} needs a {kind} checkpoint for model {config.model!r}: "
                             f"set draft=PATH")
        path = resolve_checkpoint(draft_name)
        if kind == "draft":
            part = DraftModelProposer(LlamaModel.from_pretrained(path), model.cfg.vocab_size)
        else:
            part = HeadProposer(load_head(path, model, kind))
        return HybridProposer(part, max_k=config.num_speculative_tokens) if config.proposer == "hybrid" else part

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(self, prompts: list, params: SamplingParams) -> GenerateResult:
        return self.engine.generate(prompts, params)

    def sync_weights(self, policy: dict[str, torch.Tensor], version: int,
                     draft: dict[str, torch.Tensor] | None = None) -> None:
        self.engine.load_weights(policy, version)
        if draft is not None:
            part = self.proposer.model_part if isinstance(self.proposer, HybridProposer) else self.proposer
            if not isinstance(part, DraftModelProposer):
                raise ValueError("draft weights were sent, but this backend's proposer has no draft model")
            part.model.load_weights(draft)
