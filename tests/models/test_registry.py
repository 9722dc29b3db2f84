"""`resolve_checkpoint`: built-in names, and errors that name the problem and the fix."""
import json

import pytest
import torch
from safetensors.torch import save_file

from specrl.cache import cache_dir
from specrl.models.registry import ASSETS, draft_for, resolve_checkpoint


def _checkpoint(path, config=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    save_file({"w": torch.zeros(2, 2)}, str(path / "model.safetensors"))
    return path


def test_tiny_names_resolve_to_the_committed_assets():
    assert resolve_checkpoint("tiny") == (ASSETS / "tiny").resolve()
    assert resolve_checkpoint("tiny-draft") == (ASSETS / "tiny-draft").resolve()
    assert {m: draft_for(m, "draft") for m in ("tiny", "smollm2-135m")} == {"tiny": "tiny-draft", "smollm2-135m": "smollm2-135m-draft"}


def test_a_valid_path_resolves_to_itself(tmp_path):
    assert resolve_checkpoint(str(_checkpoint(tmp_path / "m"))) == (tmp_path / "m").resolve()


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECRL_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("SPECRL_CACHE")
    assert cache_dir().parts[-2:] == (".cache", "specrl")


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint(str(tmp_path / "nope"))


def test_missing_config_is_named(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_checkpoint(str(tmp_path / "m"))


def test_missing_weights_are_named(tmp_path):
    path = _checkpoint(tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        resolve_checkpoint(str(path))


def test_pickle_weights_are_refused_by_name(tmp_path):
    path = _checkpoint(tmp_path / "m")
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin: pickle checkpoints are refused"):
        resolve_checkpoint(str(path))


def test_truncated_safetensors_is_called_corrupt(tmp_path):
    path = _checkpoint(tmp_path / "m")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:-5])
    with pytest.raises(ValueError, match="corrupt"):
        resolve_checkpoint(str(path))


def test_garbage_safetensors_is_called_corrupt(tmp_path):
    path = _checkpoint(tmp_path / "m")
    (path / "model.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="corrupt"):
        resolve_checkpoint(str(path))


def test_unparsable_config_is_named(tmp_path):
    path = _checkpoint(tmp_path / "m")
    (path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        resolve_checkpoint(str(path))


def test_missing_shard_is_named(tmp_path):
    path = _checkpoint(tmp_path / "m")
    (path / "model.safetensors").unlink()
    index = {"weight_map": {"w": "model-00001-of-00002.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
        resolve_checkpoint(str(path))


def test_missing_smollm2_mtp_head_says_which_command_makes_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECRL_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="specrl train-draft --target smollm2-135m --kind mtp"):
        resolve_checkpoint("smollm2-135m-mtp")


@pytest.mark.parametrize("name", ["smollm2-135m-eagle3", "smollm2-135m-draft"])
def test_smollm2_drafts_ship_in_the_package_with_the_command_that_made_them(monkeypatch, tmp_path, name):
    monkeypatch.setenv("SPECRL_CACHE", str(tmp_path))  # an empty cache: nothing trained on this machine
    folder = resolve_checkpoint(name)
    assert folder.parent.name == "assets"
    recipe = json.loads((folder / "specrl_train.json").read_text())
    words = recipe["command"].split()
    assert words[:2] == ["specrl", "train-draft"] and f"--kind {name.rsplit('-', 1)[1]}" in recipe["command"]
    assert "--target smollm2-135m" in recipe["command"]
