"""Bad input gets a clear error that names the problem; nothing falls back silently."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import save_random_checkpoint
from specrl.backends import BackendConfig
from specrl.engine.engine import EngineConfig, RolloutEngine
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.draft_model import DraftModelProposer


@pytest.fixture
def checkpoint(tmp_path, target_dir):
    path = tmp_path / "ckpt"
    shutil.copytree(target_dir, path)
    return path


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_unknown_architecture_is_named(checkpoint):
    edit_config(checkpoint, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="unsupported architecture model_type='gpt2'"):
        LlamaModel.from_pretrained(checkpoint)


def test_missing_checkpoint_directory_says_no_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LlamaModel.from_pretrained(tmp_path / "nowhere")


def test_corrupt_safetensors_file_is_named(checkpoint):
    (checkpoint / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(ValueError, match="corrupt or unreadable safetensors"):
        LlamaModel.from_pretrained(checkpoint)


def test_pickle_checkpoints_are_refused_not_loaded(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="pickle checkpoints are refused"):
        LlamaModel.from_pretrained(checkpoint)


def test_missing_tensor_is_named(checkpoint):
    state = load_file(str(checkpoint / "model.safetensors"))
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, str(checkpoint / "model.safetensors"))
    with pytest.raises(ValueError, match="model.layers.1.mlp.down_proj.weight"):
        LlamaModel.from_pretrained(checkpoint)


def test_non_finite_weights_are_refused(checkpoint):
    state = load_file(str(checkpoint / "model.safetensors"))
    state["model.norm.weight"][0] = float("nan")
    save_file(state, str(checkpoint / "model.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight.*NaN"):
        LlamaModel.from_pretrained(checkpoint)


def test_draft_with_another_vocabulary_is_refused(tmp_path, target_dir):
    save_random_checkpoint(tmp_path, vocab=48)
    with pytest.raises(ValueError, match="vocabulary mismatch.*48.*40"):
        DraftModelProposer(LlamaModel.from_pretrained(tmp_path), LlamaModel.from_pretrained(target_dir).cfg.vocab_size)


def test_prompt_longer_than_the_context_is_refused(target_dir):
    engine = RolloutEngine(LlamaModel.from_pretrained(target_dir), config=EngineConfig(max_model_len=64))
    with pytest.raises(ValueError, match="prompt 1 is too long for the context: 60 prompt tokens"):
        engine.generate([[1, 2], [3] * 60], SamplingParams(max_tokens=8))


def test_out_of_vocabulary_prompt_token_is_named(target_dir):
    engine = RolloutEngine(LlamaModel.from_pretrained(target_dir))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([[1, 99]], SamplingParams(max_tokens=4))


def test_empty_prompt_is_refused(target_dir):
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        RolloutEngine(LlamaModel.from_pretrained(target_dir)).generate([[]], SamplingParams(max_tokens=4))


@pytest.mark.parametrize("prompts, message", [([], "the prompt list is empty"),
                                              ("3 1 3", "prompts must be a list of prompts")])
def test_an_empty_or_bare_prompt_list_is_named(target_dir, prompts, message):
    engine = RolloutEngine(LlamaModel.from_pretrained(target_dir))
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, SamplingParams(max_tokens=4))
    assert len(engine.generate([[3, 1]], SamplingParams(max_tokens=4)).completions) == 1  # still serves


@pytest.mark.parametrize("make", [
    lambda: EngineConfig(num_speculative_tokens=-1),
    lambda: BackendConfig(num_speculative_tokens=-2),
])
def test_negative_k_is_refused(make):
    with pytest.raises(ValueError, match="K"):
        make()


@pytest.mark.parametrize("field,value", [("temperature", -0.5), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
                                         ("max_tokens", 0), ("n", 0)])
def test_invalid_sampling_parameters_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("temperature", [2e-39, 1e-300, 5e-324])
def test_a_temperature_whose_inverse_overflows_float32_is_refused_naming_it(temperature):
    with pytest.raises(ValueError, match=r"SamplingParams.temperature .* is too small to sample at"):
        SamplingParams(temperature=temperature)
    SamplingParams(temperature=3e-38)  # 1 / 3e-38 fits float32


def test_unknown_backend_or_proposer_is_named():
    with pytest.raises(ValueError, match="backend must be one of"):
        BackendConfig(backend="tgi")
    with pytest.raises(ValueError, match="proposer must be one of"):
        BackendConfig(proposer="medusa")


BAD_MAPS = [  # the draft's 7 output rows map to target ids d2t; the target has 40
    (torch.tensor([1, 1, 3, 4, 5, 6, 7]), "same target id"),
    (torch.tensor([1.0, 2, 3, 4, 5, 6, 7]), "integer"),
    (torch.tensor([1, 2, 3]), "one id per output row|integer offsets"),
    (torch.tensor([1, 2, 3, 4, 5, 6, 99]), "outside the target vocabulary"),
    (torch.tensor([-1, 2, 3, 4, 5, 6, 7]), "outside the target vocabulary"),
]


def _replace_tensor(folder, name, value):
    tensors = load_file(str(folder / "model.safetensors"))
    tensors[name] = value
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize("d2t, message", BAD_MAPS, ids=["duplicate", "float", "short", "too-large", "negative"])
def test_a_malformed_d2t_is_refused_by_the_draft_model_loader(tmp_path, target_dir, d2t, message):
    """A d2t of [1, 1, 3] against a uniform target made first-token frequencies [.16 .27 .16 .27 .16]:
    mass moved silently. Every load path checks dtype, length, range and uniqueness."""
    import transformers

    from specrl.models.reduced_vocab import build_draft, save_draft

    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir)
    save_draft(build_draft(target, 1, torch.arange(0, 14, 2)), tmp_path / "draft")
    _replace_tensor(tmp_path / "draft", "d2t", d2t)
    with pytest.raises(ValueError, match=message):
        LlamaModel.from_pretrained(tmp_path / "draft")


@pytest.mark.parametrize("d2t, message", BAD_MAPS, ids=["duplicate", "float", "short", "too-large", "negative"])
def test_a_malformed_d2t_is_refused_by_the_eagle3_loader(tmp_path, target_dir, d2t, message):
    from specrl.speculation.eagle3 import Eagle3Head
    from specrl.speculation.proposer_registry import load_head

    target = LlamaModel.from_pretrained(target_dir)
    Eagle3Head.from_target(target, d2t=torch.arange(0, 14, 2)).save(tmp_path / "head")
    offsets = d2t - torch.arange(len(d2t)) if len(d2t) == 7 else d2t  # vLLM's layout stores offsets
    _replace_tensor(tmp_path / "head", "d2t", offsets)
    with pytest.raises(ValueError, match=message):
        load_head(tmp_path / "head", target, "eagle3")


@pytest.mark.parametrize("where", ["sync_weights", "checkpoint"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_weights_are_refused_by_name(tmp_path, target_dir, where, bad):
    model = LlamaModel.from_pretrained(target_dir)
    state = load_file(str(target_dir / "model.safetensors"))
    state["model.layers.0.mlp.up_proj.weight"][3, 4] = bad
    if where == "sync_weights":
        before = model.layers[0]["gate_up"].weight.clone()
        with pytest.raises(ValueError, match="model.layers.0.mlp.up_proj.weight.*NaN or infinite"):
            model.load_weights(state)
        assert torch.equal(model.layers[0]["gate_up"].weight, before)  # nothing was replaced
    else:
        shutil.copytree(target_dir, tmp_path / "ckpt")
        save_file(state, str(tmp_path / "ckpt" / "model.safetensors"))
        with pytest.raises(ValueError, match="model.layers.0.mlp.up_proj.weight.*NaN or infinite"):
            LlamaModel.from_pretrained(tmp_path / "ckpt")


@pytest.mark.parametrize("prompt", [[5, 6.0], [5, "a"], [[5, 6]], None, [5, True]])
def test_a_prompt_that_is_not_text_or_integer_ids_is_named(target_dir, prompt):
    engine = RolloutEngine(LlamaModel.from_pretrained(target_dir))
    with pytest.raises(ValueError, match="prompt 1 must be text or a list of integer token ids"):
        engine.generate([[1, 2], prompt], SamplingParams(max_tokens=4))


def _lying_header(path):
    """A safetensors file whose header claims more bytes for a tensor than the file holds."""
    import struct

    header = json.dumps({"model.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 1 << 20]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 256)


def _pickle_as_safetensors(path, canary):
    """A pickle that would create `canary` if anything unpickled it, saved under a safetensors name."""
    import pickle

    class Payload:
        def __reduce__(self):
            return (open, (str(canary), "w"))

    path.write_bytes(pickle.dumps({"model.norm.weight": Payload()}))


@pytest.mark.parametrize("damage", ["truncated", "lying header", "pickle named .safetensors"])
@pytest.mark.parametrize("loader", ["engine", "registry", "trainer"])
def test_a_damaged_weights_file_gets_a_clear_error_and_nothing_else_is_read(checkpoint, tmp_path, damage, loader):
    """Each load path (the engine's, the model registry's check, the trainer's transformers load) refuses
    the file by name; a pickle is never unpickled (its payload would create the canary)."""
    from specrl.models.checkpoint import load_causal_lm
    from specrl.models.registry import resolve_checkpoint

    weights, canary = checkpoint / "model.safetensors", tmp_path / "canary"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "lying header":
        _lying_header(weights)
    else:
        _pickle_as_safetensors(weights, canary)
    load = {"engine": LlamaModel.from_pretrained, "registry": resolve_checkpoint,
            "trainer": lambda path: load_causal_lm(resolve_checkpoint(str(path)))}[loader]
    with pytest.raises(ValueError, match="corrupt"):
        load(checkpoint if loader != "registry" else str(checkpoint))
    assert not canary.exists()


@pytest.mark.parametrize("change", [{"hidden_size": 32}, {"num_hidden_layers": 3}, {"vocab_size": 50},
                                    {"intermediate_size": 100}])
def test_a_config_whose_shapes_do_not_fit_the_weights_is_named(checkpoint, change):
    edit_config(checkpoint, **change)
    with pytest.raises(ValueError, match="embed_tokens|missing tensor|shape|fit"):
        LlamaModel.from_pretrained(checkpoint)
