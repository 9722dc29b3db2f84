"""Shapes of the `tiny` character-level Llama and its draft, `tiny-draft`.

Both read the same character vocabulary (the arithmetic alphabet plus the special
tokens of `char_tokenizer`), so the draft can propose tokens the target verifies.

    tiny        2 layers x 128, 4 query heads / 2 KV heads, ~0.40M parameters
    tiny-draft  1 layer  x 64,  2 query heads / 1 KV head,  ~0.05M parameters
"""
from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig

from specrl.tasks.arithmetic import ALPHABET
from specrl.models.char_tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS

VOCAB_SIZE = len(SPECIAL_TOKENS) + len(ALPHABET)
PAD_ID, BOS_ID, EOS_ID = SPECIAL_TOKENS.index(PAD), SPECIAL_TOKENS.index(BOS), SPECIAL_TOKENS.index(EOS)


@dataclass(frozen=True)
class TinyShape:
    """The size of a tiny Llama.

    layers: decoder layers.
    hidden: model width.
    heads: query heads (head_dim = hidden // heads).
    kv_heads: key/value heads (grouped-query attention); must divide heads.
    ffn: SwiGLU intermediate width.
    max_positions: the longest sequence the model handles (prompt + response).
    """

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 384
    max_positions: int = 64

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"TinyShape.hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"TinyShape.kv_heads ({self.kv_heads}) must divide heads ({self.heads})")

    def llama_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=self.hidden,
            intermediate_size=self.ffn,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.hidden // self.heads,
            max_position_embeddings=self.max_positions,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=True,
            pad_token_id=PAD_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            torch_dtype="float32",
        )


TINY = TinyShape()
TINY_DRAFT = TinyShape(layers=1, hidden=64, heads=2, kv_heads=1, ffn=192)
