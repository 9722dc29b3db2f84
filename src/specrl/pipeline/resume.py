"""Checkpoint / resume: everything a killed run needs to continue with nothing lost or repeated.

Layout of `RUN_DIR/checkpoints/step_000020/`:
    policy/            Hugging Face layout (config.json + model.safetensors + tokenizer)
    draft/             the adapted draft model (Hugging Face layout) or head (its proposer's layout)
    optimizer.safetensors        AdamW moments and step counts, flattened
    draft_optimizer.safetensors  likewise for the draft
    state.json         step, policy version, optimiser param groups, Python RNG state, the pipeline's
                       state (proposer memory; async: buffer, ledger, requests)
    rng.safetensors    torch's CPU RNG state
No pickle anywhere. A checkpoint is written into a temporary folder, fsynced, and swapped
into place (`atomic.replace_folder`), so a kill mid-save leaves the previous checkpoints intact
and one copy of each always exists.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specrl.atomic import recover_folder, replace_folder
from specrl.models.checkpoint import optimizer_state, optimizer_tensors


def save_checkpoint(run_dir: Path, step: int, version: int, save_policy, optimizer_state: dict,
                    save_draft=None, draft_optimizer_state: dict | None = None, pipeline: dict | None = None) -> Path:
    """Write checkpoint `step` atomically; returns its folder. `save_policy(folder)` writes the policy
    (Hugging Face layout, with its tokenizer) and `save_draft(folder)` the adapted draft model or head
    in the layout its proposer loads; the optimizer states are torch's state dicts. `pipeline` is the
    pipeline's own state (JSON-ready: the proposer's memory; for async, the buffer, the ledger and the
    requests), saved in state.json under "pipeline"."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_policy(tmp / "policy")
    tensors, groups = optimizer_tensors(optimizer_state)
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    state = {"step": step, "version": version, "param_groups": groups, "python_rng": _python_rng(),
             "pipeline": pipeline or {}}
    if save_draft is not None:
        save_draft(tmp / "draft")
        draft_tensors, draft_groups = optimizer_tensors(draft_optimizer_state)
        save_file(draft_tensors, str(tmp / "draft_optimizer.safetensors"))
        state["draft_param_groups"] = draft_groups
    save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
    (tmp / "state.json").write_text(json.dumps(state))
    replace_folder(tmp, final)
    return final


def _python_rng() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (after finishing any swap a kill interrupted), or None."""
    root = Path(run_dir) / "checkpoints"
    for old in root.glob(".step_*.old"):
        recover_folder(root / old.name[1:-len(".old")])
    found = sorted(p for p in root.glob("step_*") if (p / "state.json").is_file())
    return found[-1] if found else None


def read_state(checkpoint: Path) -> dict:
    path = Path(checkpoint) / "state.json"
    if not path.is_file():
        raise ValueError(f"{checkpoint}: incomplete checkpoint (no state.json)")
    return json.loads(path.read_text())


def restore_training_state(checkpoint: Path, with_draft: bool = False) -> tuple[dict, dict, dict | None]:
    """Restore the RNG states from `checkpoint`; returns (state.json's contents, the optimizer's state
    dict, the draft optimizer's when `with_draft`, else None) for the trainers to load."""
    checkpoint = Path(checkpoint)
    state = read_state(checkpoint)
    optimizer = optimizer_state(load_file(str(checkpoint / "optimizer.safetensors")), state["param_groups"])
    draft_optimizer = None
    if with_draft:
        if not (checkpoint / "draft_optimizer.safetensors").is_file():
            raise ValueError(f"{checkpoint}: the run trains a draft but the checkpoint has no draft optimizer")
        draft_optimizer = optimizer_state(load_file(str(checkpoint / "draft_optimizer.safetensors")),
                                           state["draft_param_groups"])
    torch.set_rng_state(load_file(str(checkpoint / "rng.safetensors"))["torch"])
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    return state, optimizer, draft_optimizer
