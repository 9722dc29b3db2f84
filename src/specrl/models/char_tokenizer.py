"""A character-level tokenizer, saved in the Hugging Face layout.

One token per character of a fixed alphabet, plus four special tokens. It is built
with the `tokenizers` library and saved as tokenizer.json + tokenizer_config.json,
so `transformers.AutoTokenizer.from_pretrained(dir)` loads it offline as a
PreTrainedTokenizerFast. Encoding adds no special tokens and decoding inserts no
spaces: `decode(encode(s)) == s` for any string over the alphabet.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3


def build_char_tokenizer(alphabet: str) -> Tokenizer:
    """A `tokenizers.Tokenizer` with ids 0..3 for the special tokens, then one id per character."""
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every single character (newline included) is its own pre-token.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # join pieces with no separator
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def save_char_tokenizer(alphabet: str, out_dir: Path, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_char_tokenizer(alphabet).save(str(out_dir / "tokenizer.json"))
    specials = {"pad_token": PAD, "bos_token": BOS, "eos_token": EOS, "unk_token": UNK}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        **specials,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
