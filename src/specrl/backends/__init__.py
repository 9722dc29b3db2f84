"""Rollout backends behind one protocol: `embedded` (default, PyTorch) and `vllm` (the scale path)."""
from specrl.backends.base import Backend, BackendConfig


def make_backend(config: BackendConfig) -> Backend:
    """Build the backend `config.backend` names."""
    if config.backend == "embedded":
        from specrl.backends.embedded import EmbeddedBackend

        return EmbeddedBackend(config)
    raise ValueError(f"unknown backend {config.backend!r}; choose one of {BackendConfig.BACKENDS}")


__all__ = ["Backend", "BackendConfig", "make_backend"]
