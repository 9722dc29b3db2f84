"""Checkpoint I/O: Llama-family Hugging Face folders (config.json + safetensors + tokenizer), safely.

Supported `model_type`s: llama, mistral, qwen2, qwen3 (SmolLM2 is llama). Weights are
read with safetensors only and tokenizers without remote code: loading a checkpoint
never runs code and never unpickles. Every failure names the file or field at fault.
Model folders are written atomically (`save_atomically`).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specrl.atomic import replace_folder

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    """The fields of a Hugging Face Llama-family config.json the engine uses."""

    model_type: str
    vocab_size: int  # size of the input embedding (the tokenizer's vocabulary)
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # None, or {"rope_type": "llama3", ...}
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # RMSNorm on q and k per head (Qwen3)
    eos_token_ids: tuple[int, ...]
    draft_vocab_size: int | None = None  # reduced output vocabulary of a draft (needs a `d2t` map)

    @property
    def output_vocab_size(self) -> int:
        return self.draft_vocab_size or self.vocab_size


def _require(raw: dict, key: str, path: Path):
    if key not in raw:
        raise ValueError(f"{path}: config.json has no '{key}' field")
    return raw[key]


def parse_config(raw: dict, path: Path) -> ModelConfig:
    """Validate a config.json dict; unknown architectures fail with their name."""
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path}: unsupported architecture model_type={model_type!r} "
            f"(architectures={raw.get('architectures')}); the embedded engine supports {SUPPORTED_MODEL_TYPES}"
        )
    heads = _require(raw, "num_attention_heads", path)
    hidden = _require(raw, "hidden_size", path)
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(f"{path}: unsupported rope_type {rope_type!r} (supported: default, llama3)")
    theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    max_pos = _require(raw, "max_position_embeddings", path)
    window = raw.get("sliding_window") if raw.get("use_sliding_window", model_type == "mistral") else None
    if window is not None and window < max_pos:
        max_pos = window  # beyond the window the model needs sliding attention, which the engine refuses
    return ModelConfig(
        model_type=model_type,
        vocab_size=_require(raw, "vocab_size", path),
        hidden_size=hidden,
        intermediate_size=_require(raw, "intermediate_size", path),
        num_hidden_layers=_require(raw, "num_hidden_layers", path),
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_scaling=rope if rope_type == "llama3" else None,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type == "qwen3",
        eos_token_ids=eos_ids,
        draft_vocab_size=raw.get("draft_vocab_size"),
    )


def read_config_json(checkpoint_dir: Path) -> dict:
    """The raw config.json of a checkpoint folder; a missing or unparsable file is named."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint_dir}: no config.json (not a Hugging Face checkpoint directory)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err


def load_config(checkpoint_dir: Path) -> ModelConfig:
    return parse_config(read_config_json(checkpoint_dir), Path(checkpoint_dir) / "config.json")


def weight_files(checkpoint_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: model.safetensors, or the shards its index names.

    Pickle-based weights (*.bin, *.pt) are never loaded; finding only those is an error.
    """
    checkpoint_dir = Path(checkpoint_dir)
    single, index = checkpoint_dir / "model.safetensors", checkpoint_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as err:
            raise ValueError(f"{index}: unreadable shard index ({err!r})") from None
        missing = [s for s in shards if not (checkpoint_dir / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{checkpoint_dir}: weight shards missing: {', '.join(missing)}")
        return [checkpoint_dir / s for s in shards]
    pickles = sorted(p.name for p in checkpoint_dir.glob("*.bin")) + sorted(p.name for p in checkpoint_dir.glob("*.pt*"))
    hint = f" (found {', '.join(pickles)}: pickle checkpoints are refused, convert them to safetensors)" if pickles else ""
    raise FileNotFoundError(f"{checkpoint_dir}: no model.safetensors weights{hint}")


def load_state_dict(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint's safetensors files, as fp32 (ints stay ints)."""
    checkpoint_dir = Path(checkpoint_dir)
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(checkpoint_dir):
        try:
            tensors = load_file(str(file))
        except (SafetensorError, OSError, RuntimeError) as err:
            raise ValueError(f"{file}: corrupt or unreadable safetensors file ({err})") from err
        state.update(tensors)
    for name, tensor in state.items():
        if tensor.is_floating_point():
            state[name] = tensor.float()
    check_finite(state, str(checkpoint_dir))
    return state


def check_d2t(d2t: torch.Tensor, output_size: int, vocab_size: int, source: str) -> torch.Tensor:
    """A draft's output-id -> target-id map, checked: a 1-D integer tensor of `output_size` distinct ids
    in 0..vocab_size-1. Returned as int64. A malformed map would silently put draft mass on the wrong
    target tokens (or twice on one), so every load path refuses one, naming the problem."""
    if d2t.is_floating_point() or d2t.is_complex() or d2t.dtype == torch.bool:
        raise ValueError(f"{source}: d2t must hold integer ids, got dtype {d2t.dtype}")
    if d2t.dim() != 1 or d2t.numel() != output_size:
        raise ValueError(f"{source}: d2t must be 1-D with one id per output row ({output_size}), "
                         f"got shape {tuple(d2t.shape)}")
    d2t = d2t.long()
    if output_size and (int(d2t.min()) < 0 or int(d2t.max()) >= vocab_size):
        raise ValueError(f"{source}: d2t holds ids outside the target vocabulary 0..{vocab_size - 1} "
                         f"(min {int(d2t.min())}, max {int(d2t.max())})")
    if torch.unique(d2t).numel() != output_size:
        raise ValueError(f"{source}: d2t maps two draft ids to the same target id")
    return d2t


def check_finite(state: dict[str, torch.Tensor], source: str) -> None:
    """Raise naming the first floating-point tensor that holds NaN or infinite values."""
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{source}: tensor '{name}' holds NaN or infinite values")


def load_causal_lm(checkpoint_dir):
    """A transformers causal LM from a checked checkpoint folder, fp32, from safetensors only and
    without remote code (the trainer's and draft trainer's copy of a model)."""
    from transformers import AutoModelForCausalLM

    weight_files(Path(checkpoint_dir))  # refuses a folder whose only weights are pickles
    return AutoModelForCausalLM.from_pretrained(str(checkpoint_dir), dtype=torch.float32, use_safetensors=True,
                                                trust_remote_code=False)


def load_tokenizer(checkpoint_dir):
    """The checkpoint's own tokenizer, offline, never running checkpoint code."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(checkpoint_dir), trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"{checkpoint_dir}: cannot load its tokenizer ({err})") from err


def save_atomically(out: Path, write: Callable[[Path], object], record: dict) -> None:
    """`write(tmp)` fills a temporary folder, `record` goes to specrl_train.json, and the folder
    replaces `out` only once complete and fsynced (`atomic.replace_folder`): a kill never leaves a
    half-written model behind, nor a moment without a copy."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        (tmp / "specrl_train.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def optimizer_tensors(state: dict) -> tuple[dict[str, torch.Tensor], list]:
    """torch's optimizer state dict -> (flat tensors "index.slot", param groups) for safetensors."""
    tensors = {}
    for index, slots in state["state"].items():
        for name, value in slots.items():
            tensors[f"{index}.{name}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return tensors, state["param_groups"]


def optimizer_state(tensors: dict[str, torch.Tensor], groups: list) -> dict:
    """The inverse of `optimizer_tensors`: torch's optimizer state dict, for `load_state_dict`."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": groups}
