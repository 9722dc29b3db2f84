"""Rollout backends behind one protocol: `embedded` (default, PyTorch) and `vllm` (the scale path)."""
import os

from specrl.backends.base import Backend, BackendConfig, ModelSet, resolve_models


def make_backend(config: BackendConfig, vllm_options=None, models: ModelSet | None = None) -> Backend:
    """Build the backend `config.backend` names, on `models` (a run passes the set it resolved once; None
    resolves `config.model` and its draft here); `vllm_options` (a VLLMOptions) tunes the vllm backend."""
    models = models or resolve_models(config)
    if config.backend == "embedded":
        from specrl.backends.embedded import EmbeddedBackend

        return EmbeddedBackend(config, models)
    if config.backend == "vllm":
        # vLLM logs to stdout by default; specrl keeps stdout for its one closing JSON line
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        try:
            from vllm import LLM  # noqa: F401  (not find_spec: a tests/vllm folder on sys.path looks like a package)
        except ImportError as err:
            raise ImportError("backend 'vllm' needs vLLM, which is not installed: pip install -e '.[vllm]'") from err
        from specrl.backends.vllm import VLLMBackend

        return VLLMBackend(config, vllm_options, models)
    raise ValueError(f"unknown backend {config.backend!r}")


__all__ = ["Backend", "BackendConfig", "ModelSet", "make_backend", "resolve_models"]
