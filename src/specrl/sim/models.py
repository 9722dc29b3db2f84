"""Model catalogue: shapes, and the parameter / KV counts derived from them.

Parameter counting conventions (checked against the published totals in tests):
  - a dense decoder layer has attention (q, k, v, o) plus a SwiGLU MLP (3 matrices);
  - a MoE layer replaces the MLP by `experts` routed SwiGLU experts (top_k active)
    plus `shared_experts` always-active ones;
  - norms, biases and router weights are ignored (< 0.1% of parameters);
  - the input embedding is counted in totals but never streamed: a step reads only
    the rows it looks up. The LM head is streamed every forward (it is the
    embedding matrix itself when tied).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer.

    layers: decoder layers (MoE and dense together).
    hidden: residual width.
    heads, kv_heads, head_dim: attention shape (GQA).
    ffn: SwiGLU width of dense layers.
    vocab: LM-head rows.
    experts, top_k, expert_ffn, shared_experts: MoE shape (experts=0 means dense).
    dense_layers: leading layers that stay dense in a MoE model (DeepSeek-V3: 3).
    attn_params_override: attention parameters per layer when not plain GQA (MLA).
    kv_elems_override: cached elements per token per layer when not 2*kv_heads*head_dim (MLA latent).
    attn_qk_dim, attn_v_dim: per-head dims used by attention FLOPs (default head_dim).
    tied: LM head shares the embedding matrix.
    extra_params: parameters outside layers and embeddings (drafts' fusion FCs).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    attn_params_override: int | None = None
    kv_elems_override: int | None = None
    attn_qk_dim: int | None = None
    attn_v_dim: int | None = None
    tied: bool = False
    extra_params: int = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0


def attention_params(m: ModelSpec) -> int:
    """Attention weights of one layer: q and o (hidden x heads*head_dim), k and v (hidden x kv_heads*head_dim)."""
    if m.attn_params_override is not None:
        return m.attn_params_override
    return 2 * m.hidden * m.heads * m.head_dim + 2 * m.hidden * m.kv_heads * m.head_dim


def expert_params(m: ModelSpec) -> int:
    """Weights of one routed SwiGLU expert: gate, up, down (3 x hidden x expert_ffn)."""
    return 3 * m.hidden * m.expert_ffn


def dense_params(m: ModelSpec) -> int:
    """Weights every token reads: attention, dense MLPs, shared experts, LM head and extras.

    Excludes the input embedding (looked up, not streamed) and routed experts.
    """
    mlp = 3 * m.hidden * m.ffn * (m.layers - m.moe_layers)
    shared = m.shared_experts * expert_params(m) * m.moe_layers
    lm_head = m.vocab * m.hidden
    return m.layers * attention_params(m) + mlp + shared + lm_head + m.extra_params


def routed_params(m: ModelSpec) -> int:
    """All routed-expert weights of the model."""
    return m.experts * expert_params(m) * m.moe_layers


def total_params(m: ModelSpec) -> int:
    """Every parameter, counting the input embedding once (tied) or twice (untied)."""
    embedding = 0 if m.tied else m.vocab * m.hidden
    return dense_params(m) + routed_params(m) + embedding


def active_params(m: ModelSpec) -> int:
    """Parameters one token touches (the N_active of 6*N*tokens), embedding included like total_params."""
    embedding = 0 if m.tied else m.vocab * m.hidden
    return dense_params(m) + m.top_k * expert_params(m) * m.moe_layers + embedding


def kv_bytes_per_token(m: ModelSpec, bytes_per_elem: float = 2) -> float:
    """KV-cache bytes one token occupies across all layers (K and V, or MLA latent)."""
    per_layer = m.kv_elems_override if m.kv_elems_override is not None else 2 * m.kv_heads * m.head_dim
    return per_layer * m.layers * bytes_per_elem


def attention_flops_per_pair(m: ModelSpec) -> float:
    """FLOPs for one (query token, cached token) pair over all layers: QK^T and AV, 2 FLOPs per MAC."""
    qk = m.attn_qk_dim or m.head_dim
    v = m.attn_v_dim or m.head_dim
    return 2.0 * m.heads * (qk + v) * m.layers


# DeepSeek-V3 MLA per layer: q_a 7168x1536, q_b 1536x(128*192), kv_a 7168x576, kv_b 512x(128*256), o (128*128)x7168.
_DSV3_ATTN = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
        ModelSpec("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936),
        ModelSpec("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 0, 151936, experts=128, top_k=8, expert_ffn=1536),
        ModelSpec(
            "deepseek-v3", 61, 7168, 128, 0, 128, 18432, 129280, experts=256, top_k=8, expert_ffn=2048,
            shared_experts=1, dense_layers=3, attn_params_override=_DSV3_ATTN, kv_elems_override=576,
            attn_qk_dim=576, attn_v_dim=512,
        ),
        # Draft-sized models used as external drafters.
        ModelSpec("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, tied=True),
        ModelSpec("llama-3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, tied=True),
        # specrl's own CPU models (fp32): see specrl.models.tiny and the smollm2 loader.
        ModelSpec("tiny", 2, 128, 4, 2, 32, 384, 32, tied=True),
        ModelSpec("tiny-draft", 1, 64, 2, 1, 32, 192, 32, tied=True),
        ModelSpec("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, tied=True),
    ]
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None
