"""vLLM-only settings, and the `speculative_config` they and a `BackendConfig` make.

`BackendConfig` (shared with the embedded engine) says which model, proposer, draft
and K; `VLLMOptions` says how vLLM runs them. `speculative_config` builds vLLM's dict:

    proposer  vLLM method    keys set here
    none      (no speculation)
    ngram     ngram          prompt_lookup_max = ngram_max_n, prompt_lookup_min = 1
    draft     draft_model    model = the draft checkpoint, draft_sample_method
    eagle3    eagle3         model = the head's folder (specrl saves EAGLE-3 heads in vLLM's layout)

mtp, suffix and hybrid are embedded-only and refused with the reason: vLLM's `mtp` method
serves only architectures that ship an MTP model class (not Llama), and vLLM has no
group-suffix proposer. `speculative_overrides` is merged on top, so any other vLLM key
passes straight through. Acceptance rules that change the sampled distribution are refused unless
`lossy_acceptance=True`: exactness is the product's promise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from specrl.backends.base import BackendConfig
from specrl.models.registry import draft_for, resolve_checkpoint

# rejection_sample_method values that keep the target distribution exactly
# ("block" is block verification, Sun et al. 2024, which is also lossless).
LOSSLESS_REJECTION_METHODS = ("standard", "block")
LOSSY_KEYS = ("synthetic_acceptance_rates", "synthetic_acceptance_length")


@dataclass(frozen=True)
class VLLMOptions:
    """How vLLM runs; the defaults suit real runs, `VLLMOptions.for_tests()` suits tests."""

    MODES: ClassVar[tuple[str, ...]] = ("multiprocess", "inprocess")
    DRAFT_SAMPLE_METHODS: ClassVar[tuple[str, ...]] = ("greedy", "probabilistic")

    # multiprocess: vLLM's default engine (a busy engine-core process, compiled graphs);
    #   fast, starts in 45-90 s on these CPUs, and scripts need an `if __name__ == "__main__"` guard.
    # inprocess: engine core and worker in this process, eager; starts in ~4 s, ~6x slower.
    mode: str = "multiprocess"
    dtype: str = "float32"  # float32 so logprobs match the trainer's to fp32 rounding
    kv_cache_gb: float = 1.0  # KV cache memory vLLM reserves up front
    max_num_seqs: int = 256  # most requests vLLM batches in one step
    seed: int = 0  # vLLM's engine seed (requests without a seed draw from it)
    # greedy: drafts are the draft model's argmax, verified as one-hot proposals (exact);
    # probabilistic: drafts are sampled and verified against the draft's full distribution (exact).
    draft_sample_method: str = "greedy"
    speculative_overrides: dict = field(default_factory=dict)  # extra speculative_config keys, merged last
    lossy_acceptance: bool = False  # allow rejection_sample_method="synthetic" and other lossy acceptance

    def __post_init__(self):
        if self.mode not in self.MODES:
            raise ValueError(f"VLLMOptions.mode must be one of {self.MODES}, got {self.mode!r}")
        if self.draft_sample_method not in self.DRAFT_SAMPLE_METHODS:
            raise ValueError(f"VLLMOptions.draft_sample_method must be one of {self.DRAFT_SAMPLE_METHODS}, "
                             f"got {self.draft_sample_method!r}")
        if self.kv_cache_gb <= 0:
            raise ValueError(f"VLLMOptions.kv_cache_gb must be > 0, got {self.kv_cache_gb}")
        if self.max_num_seqs < 1:
            raise ValueError(f"VLLMOptions.max_num_seqs must be >= 1, got {self.max_num_seqs}")

    @classmethod
    def for_tests(cls, **changes) -> "VLLMOptions":
        """In-process eager mode with a small KV cache: quick to start, one process."""
        return cls(**{"mode": "inprocess", "kv_cache_gb": 0.25, "max_num_seqs": 64, **changes})


def draft_checkpoint(config: BackendConfig) -> str:
    """The draft (or head) folder: `config.draft`, else the model's registered one for the proposer."""
    name = config.draft or draft_for(config.model, config.proposer)
    if name is None:
        raise ValueError(f"proposer={config.proposer} needs a checkpoint for model {config.model!r}: set draft=PATH")
    return str(resolve_checkpoint(name))


EMBEDDED_ONLY = {
    "mtp": "vLLM's mtp method serves only architectures with an MTP model class (DeepSeek-V3, Qwen3-Next, MiMo, "
           "...), not Llama",
    "suffix": "vLLM has no group-suffix (sibling rollout) proposer",
    "hybrid": "vLLM has no hybrid proposer",
}


def check_lossless(spec: dict, lossy_acceptance: bool) -> None:
    """Raise unless `spec` keeps the target distribution exactly, or lossy acceptance was opted into."""
    method = spec.get("rejection_sample_method", "standard")
    lossy = [key for key in LOSSY_KEYS if spec.get(key) is not None]
    if method not in LOSSLESS_REJECTION_METHODS:
        lossy.insert(0, f"rejection_sample_method={method!r}")
    if lossy and not lossy_acceptance:
        raise ValueError(f"speculative_config setting(s) {', '.join(lossy)} change the sampled distribution "
                         "(lossy acceptance); set VLLMOptions(lossy_acceptance=True) to allow it")


def speculative_config(config: BackendConfig, options: VLLMOptions) -> dict | None:
    """vLLM's `speculative_config` for this backend, or None for no speculation (proposer none or K = 0)."""
    if config.proposer == "none" or config.num_speculative_tokens == 0:
        return None
    spec: dict = {"num_speculative_tokens": config.num_speculative_tokens}
    if config.proposer in EMBEDDED_ONLY:
        raise ValueError(f"proposer={config.proposer} is not available with backend=vllm: "
                         f"{EMBEDDED_ONLY[config.proposer]}; use backend=embedded")
    if config.proposer == "ngram":
        spec.update(method="ngram", prompt_lookup_max=config.ngram_max_n, prompt_lookup_min=1)
    elif config.proposer == "eagle3":
        spec.update(method="eagle3", model=draft_checkpoint(config))
    else:
        spec.update(method="draft_model", model=draft_checkpoint(config),
                    draft_sample_method=options.draft_sample_method)
    spec.update(options.speculative_overrides)
    check_lossless(spec, options.lossy_acceptance)
    return spec
