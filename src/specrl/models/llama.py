"""The Llama-family network the embedded engine and the drafts run: a compact inference path.

One module covers Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm)
and SmolLM2 (Llama with tied embeddings). Projections are fused (qkv, gate+up) so
one decode step is a handful of matmuls per layer. fp32 throughout, inference only.

Decoding and verification multiply a few rows (M = B*(K+1)) by weights read from DRAM, and
that multiplication is most of a step. Each `Projection` applies its weight with the kernel
that streams it fastest for the M at hand:

    fast path (default)  specrl's small-row kernel (`specrl.kernels.small_gemm`, AVX-512 or AVX2) for
                         M <= 128, the weight packed once per load; F.linear (MKL) above
    eager                MKL only: F.linear for M = 2..3, x @ W_t for every other M

What each path costs per row count, on each CPU class, is measured by `specrl bench kernel` (its tables
are in docs/fast_path.md).

The kernel also computes each row independently of the others, in one fixed order, so a
row's logits are the same bit for bit whether it is decoded alone or verified with drafts.
"""
from __future__ import annotations

import copy
import math
import os
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from specrl.kernels import decoder_layer, small_gemm
from specrl.models.checkpoint import (ModelConfig, check_d2t, check_finite, load_state_dict, parse_config,
                                      read_config_json)
from specrl.models.kv_cache import KVCache


class Projection:
    """y = x W^T (+ bias) for W [out, in], with the kernel that streams W fastest for the row count M
    (see the module docstring). `fast` packs W for specrl's kernel; otherwise W is also kept
    transposed for MKL's fastest M = 1 and M >= 4 path. Either way twice the weight memory."""

    ROWS_FOR_LINEAR = (2, 3)  # eager: F.linear beats x @ W_t only here

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, fast: bool = False):
        self.weight = weight.contiguous()  # [out, in]
        self.bias = bias
        self.packed = small_gemm.pack(self.weight) if fast else None  # [ceil(out/block), in, block]
        self.weight_t = None if fast else self.weight.t().contiguous()  # [in, out]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.packed is not None:
            if rows > small_gemm.MAX_ROWS or (x.requires_grad and torch.is_grad_enabled()):
                # (the kernel has no backward: a head trained through the target's lm_head needs F.linear)
                return F.linear(x, self.weight, self.bias)
            y = small_gemm.matmul(x, self.packed, self.weight.shape[0])
        elif rows in self.ROWS_FOR_LINEAR:
            return F.linear(x, self.weight, self.bias)
        else:
            y = x @ self.weight_t
        return y + self.bias if self.bias is not None else y


INT8_KERNEL_ENV = "SPECRL_INT8_KERNEL"  # pins the int8 self-draft's kernel (one of `int8_kernels()`, or eager)


def int8_kernels() -> tuple[str, ...]:
    """The int8 kernels this CPU runs, the default first (the one `Int8Projection` uses unless told, or pinned by
    $SPECRL_INT8_KERNEL): `vnni` (int8 activations in groups of 16 by int8 weights, AVX-512 VNNI) where the CPU
    has it, `avx-vnni` (`vnni`'s integers and bits on 256-bit registers: AVX-VNNI, or AVX-512 VL with VNNI) where
    it has that, `avx512` (int8 weights widened to fp32 16 at a time, fp32 activations) where it has AVX-512,
    `avx2-int8` (`vnni`'s integers and bits on AVX2) and `avx2` (weights widened 8 at a time) wherever the fast
    path runs."""
    if small_gemm.unavailable():
        return ()
    return tuple(name for name, why in (("vnni", small_gemm.vnni_unavailable()),
                                        ("avx-vnni", small_gemm.avx_vnni_unavailable()),
                                        ("avx512", small_gemm.avx512_unavailable()), ("avx2-int8", ""),
                                        ("avx2", "")) if not why)


def default_int8_kernel(available: tuple[str, ...]) -> str:
    """$SPECRL_INT8_KERNEL where set (refused, naming the variable, when this CPU cannot run it), else the first
    of `available` (eager where none is)."""
    pinned = os.environ.get(INT8_KERNEL_ENV)
    if pinned:
        if pinned not in available + ("eager",):
            raise ValueError(f"{INT8_KERNEL_ENV}={pinned!r}: this CPU runs the int8 kernels "
                             f"{', '.join(available + ('eager',))}")
        return pinned
    return available[0] if available else "eager"


def kernels_report() -> dict:
    """The kernels a model built here runs, for benchmark records: the fp32 projections' (`avx512`, `avx2` or
    `eager`), the int8 self-draft's default (`default_int8_kernel`), the CPU flags that chose them and the class
    they make (`small_gemm.cpu_class`)."""
    available = int8_kernels()
    fp32 = "eager" if small_gemm.unavailable() else "avx512" if small_gemm.fp32_block() == 16 else "avx2"
    flags = small_gemm.cpu_flags()
    return {"fp32_kernel": fp32, "int8_kernel": default_int8_kernel(available), "cpu_flags": flags,
            "cpu_class": small_gemm.cpu_class(flags)}


class Int8Projection:
    """y ~ x (q * scale)^T (+ bias): a `Projection`'s W rounded to int8 per output row (symmetric, fp32 scale;
    `small_gemm.quantize_int8`), for the int8 self-draft.

    kernel  None: `default_int8_kernel`; `vnni` / `avx-vnni` / `avx2-int8`: each row of x rounded to int8 in
            groups of 16 along K too (`small_gemm.quantize_activations`) and multiplied in integers; `avx512` /
            `avx2`: activations stay fp32 and each int8 weight is widened in registers. Each streams a quarter of
            fp32's bytes at every M (there is no int8 MKL path to hand large M to). `eager`, and wherever the fast path is
            off: the rounded weights applied dequantized to fp32 activations, the `avx512` / `avx2` draft.
    """

    def __init__(self, projection: Projection, kernel: str | None = None):
        available = int8_kernels() if projection.packed is not None else ()
        kernel = kernel or default_int8_kernel(available)
        if kernel not in available + ("eager",):
            raise ValueError(f"int8 kernel {kernel!r} cannot run here; this CPU runs {', '.join(available) or 'none'}")
        self.kernel, self.bias = kernel, projection.bias
        self.packed = self.scales = self.weight_t = None
        # q [out, in] int8, scale [out] fp32, and the weights as the kernel reads them
        if kernel in small_gemm.INTEGER_KERNELS:  # [ceil(out/16), in rounded up to 16, 16] uint8, [16 * ceil(out/16)]
            self.q, self.scale, self.packed, self.scales = small_gemm.quantize_pack_vnni(projection.weight)
        else:
            self.q, self.scale = small_gemm.quantize_int8(projection.weight)
            if kernel == "eager":
                self.weight_t = self.dequantized().t().contiguous()  # [in, out] fp32
            else:  # [ceil(out/block), in, block] int8, [block * ceil(out/block)] fp32
                self.packed, self.scales = small_gemm.pack_int8(self.q, self.scale,
                                                                block=16 if kernel == "avx512" else 8)

    def dequantized(self) -> torch.Tensor:
        return self.q.float() * self.scale.unsqueeze(1)  # [out, in]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            y = small_gemm.matmul(x, self.packed, self.q.shape[0], scales=self.scales, integer=self.kernel)
        else:
            y = x @ self.weight_t
        return y + self.bias if self.bias is not None else y


def fast_path_available(wanted: bool) -> bool:
    """Whether projections take the fast path: `wanted` and the kernel runs here. When it was wanted
    but cannot run, say why (once per reason) and run eager, as `backend.compile=false` would."""
    if not wanted:
        return False
    reason = small_gemm.unavailable()
    if reason:
        warnings.warn(f"specrl's fast path is unavailable ({reason}); running eager PyTorch. Build it with "
                      "`make` (or `python -m specrl.kernels.small_gemm`), or set backend.compile=false "
                      "to choose eager.", RuntimeWarning, stacklevel=3)
        return False
    return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies [D/2], with Llama-3.1 frequency scaling when configured."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    if cfg.rope_scaling is None:
        return inv.float()
    s = cfg.rope_scaling
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv
    smooth = ((old_len / wavelen) - low) / (high - low)
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled).float()


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [P, D] of every position's RoPE angles (P = max_position_embeddings, D = head_dim)."""
    angles = torch.outer(torch.arange(cfg.max_position_embeddings, dtype=torch.float32), rope_inverse_frequencies(cfg))
    angles = torch.cat([angles, angles], dim=-1)  # [P, D]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the Hugging Face convention). x [B, H, T, D]; cos, sin [B, 1, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


# tensors a Llama-family checkpoint may leave out: a tied lm_head, qkv biases (Qwen2), q/k norms (Qwen3)
OPTIONAL_TENSORS = ("lm_head.weight", "_proj.bias", "q_norm.weight", "k_norm.weight")


class LlamaModel:
    """Weights plus a forward pass over a KVCache; built by `from_pretrained`."""

    def __init__(self, cfg: ModelConfig, state: dict[str, torch.Tensor], source: str = "<memory>",
                 fast_path: bool = True):
        self.cfg = cfg
        self.source = source
        self.fast_path = fast_path_available(fast_path)  # small-row kernel for projections (module docstring)
        self.load_weights(state)
        self.rope_cos, self.rope_sin = rope_tables(cfg)

    @classmethod
    def from_pretrained(cls, checkpoint_dir: str | Path, fast_path: bool = True,
                        shared: dict[str, torch.Tensor] | None = None) -> "LlamaModel":
        """Load a checkpoint. A draft that shares tensors with its target (config.json
        `specrl_shared_with_target`, e.g. the input embedding) takes them from `shared`."""
        checkpoint_dir = Path(checkpoint_dir)
        raw = read_config_json(checkpoint_dir)
        state = load_state_dict(checkpoint_dir)
        needed = raw.get("specrl_shared_with_target") or []
        missing = [name for name in needed if name not in (shared or {})]
        if missing:
            raise ValueError(f"{checkpoint_dir}: shares {missing} with its target; load it as a draft of that "
                             "target (proposer=draft), not on its own")
        state.update({name: shared[name] for name in needed})
        return cls(parse_config(raw, checkpoint_dir / "config.json"), state, source=str(checkpoint_dir),
                   fast_path=fast_path)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the config implies, with its shape (lm_head, d2t, biases and q/k norms are checked
        where present)."""
        c = self.cfg
        H, d, I = c.hidden_size, c.head_dim, c.intermediate_size
        shapes = {"model.embed_tokens.weight": (c.vocab_size, H), "model.norm.weight": (H,),
                  "lm_head.weight": (c.output_vocab_size, H)}
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (c.num_attention_heads * d, H),
                p + "self_attn.k_proj.weight": (c.num_key_value_heads * d, H),
                p + "self_attn.v_proj.weight": (c.num_key_value_heads * d, H),
                p + "self_attn.o_proj.weight": (H, c.num_attention_heads * d),
                p + "self_attn.q_proj.bias": (c.num_attention_heads * d,),
                p + "self_attn.k_proj.bias": (c.num_key_value_heads * d,),
                p + "self_attn.v_proj.bias": (c.num_key_value_heads * d,),
                p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
            })
        return shapes

    def check_weights(self, state: dict[str, torch.Tensor], source: str | None = None) -> None:
        """Raise ValueError unless `state` (Hugging Face tensor names) holds every tensor the config needs, each
        of the right shape and finite, and a well-formed d2t where the config has a reduced output vocabulary.
        Changes nothing. Errors name `source` (a weight sync passes which weights these are), else the folder
        the model came from."""
        cfg, source = self.cfg, source or self.source
        check_finite(state, source)
        expected = self.expected_shapes()
        wrong = [f"{name} {tuple(state[name].shape)} != {shape}" for name, shape in expected.items()
                 if name in state and tuple(state[name].shape) != shape]
        if wrong:
            raise ValueError(f"{source}: tensors do not fit config.json: {'; '.join(wrong[:3])}")
        missing = [name for name in expected if name not in state and not name.endswith(OPTIONAL_TENSORS)]
        if missing:
            raise ValueError(f"{source}: checkpoint is missing tensor '{missing[0]}'")
        head = state.get("lm_head.weight")
        head = state["model.embed_tokens.weight"] if head is None and cfg.tie_word_embeddings else head
        if head is None:
            raise ValueError(f"{source}: checkpoint is missing tensor 'lm_head.weight'")
        if cfg.draft_vocab_size:
            if "d2t" not in state:
                raise ValueError(f"{source}: config sets draft_vocab_size but the checkpoint has no 'd2t' tensor")
            check_d2t(state["d2t"], head.shape[0], cfg.vocab_size, source)
        elif head.shape[0] != cfg.vocab_size:
            raise ValueError(f"{source}: lm_head has {head.shape[0]} rows but vocab_size is {cfg.vocab_size} "
                             "(a reduced output vocabulary needs draft_vocab_size and a 'd2t' tensor)")

    def load_weights(self, state: dict[str, torch.Tensor], source: str | None = None) -> None:
        """(Re)load weights from Hugging Face tensor names. Everything is checked before anything is
        replaced (`check_weights`): a missing tensor, one whose shape does not fit the config, one holding NaN
        or infinite values, or a malformed d2t is named, and the model keeps its previous weights."""
        cfg, source = self.cfg, source or self.source
        self.check_weights(state, source)

        def get(name: str) -> torch.Tensor:
            return state[name].float()

        def opt(name: str) -> torch.Tensor | None:
            return state[name].float() if name in state else None

        embed = get("model.embed_tokens.weight")  # [V, H]
        head = opt("lm_head.weight")
        head = embed if head is None else head
        # [N] long: draft vocab id -> target vocab id (reduced-vocab drafts)
        d2t = check_d2t(state["d2t"], head.shape[0], cfg.vocab_size, source) if cfg.draft_vocab_size else None
        layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            qkv = [get(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
            bias = [opt(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
            layers.append({
                "attn_norm": get(p + "input_layernorm.weight"),
                "qkv": Projection(torch.cat(qkv, 0), torch.cat(bias, 0) if all(b is not None for b in bias) else None,
                                  fast=self.fast_path),
                "o": Projection(get(p + "self_attn.o_proj.weight"), fast=self.fast_path),
                "q_norm": opt(p + "self_attn.q_norm.weight"),
                "k_norm": opt(p + "self_attn.k_norm.weight"),
                "mlp_norm": get(p + "post_attention_layernorm.weight"),
                "gate_up": Projection(torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], 0),
                                      fast=self.fast_path),
                "down": Projection(get(p + "mlp.down_proj.weight"), fast=self.fast_path),
            })
        self.embed, self.lm_head = embed, Projection(head, fast=self.fast_path)
        self.final_norm = get("model.norm.weight")
        self.d2t, self.layers = d2t, layers
        self._fuse_layers()

    def _fuse_layers(self) -> None:
        """Each layer as one kernel call (`decoder_layer`) where all can run so; else None (PyTorch operations)."""
        fits = all(decoder_layer.supported(layer, self.cfg) for layer in self.layers)
        self.fused_layers = [decoder_layer.Layer.of(layer, self.cfg) for layer in self.layers] if fits else None

    def int8_copy(self, kernel: str | None = None) -> "LlamaModel":
        """This model with every projection and the LM head rounded to int8 (`Int8Projection`, on `kernel`),
        sharing the embeddings, norms and RoPE tables: the int8 self-draft. It keeps no reference to the fp32
        projections, so a later `load_weights` on this model leaves the copy as it was until it is made again."""
        draft = copy.copy(self)
        draft.layers = [{name: Int8Projection(part, kernel) if isinstance(part, Projection) else part
                         for name, part in layer.items()} for layer in self.layers]
        draft.lm_head = Int8Projection(self.lm_head, kernel)
        draft._fuse_layers()
        return draft

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.cfg
        return KVCache.allocate(c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        cache: KVCache,
        hidden_layers: tuple[int, ...] = (),
        tree=None,
        logits: bool = True,
    ) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
        """Run T new tokens per row after the cache's `lens`; returns logits [B, T, V_out] (None with
        `logits=False`: a prefill that only fills the cache skips the LM head, a fifth of a 64-token
        prompt's pass on SmolLM2) and the residual stream after each layer in `hidden_layers` ([B, T, H];
        -1 = final normed).

        The tokens are a chain (token t at position lens + t, attending to everything before it), or,
        given `tree` (a `speculation.tree.TreeShape`, T = tree.size), a tree: token t sits at position
        lens + tree.depths[t] and attends to the row's past and its tree ancestors. Either way token t's
        K/V go to cache slot lens + t; `cache.lens` is left for the caller to advance.
        """
        c = self.cfg
        B, T = input_ids.shape
        if cache.batch != B:  # (the fused layer writes each row's K/V by its index: a smaller cache must not get here)
            raise ValueError(f"the KV cache holds {cache.batch} rows but the input has {B}")
        slots = cache.lens.unsqueeze(1) + torch.arange(T).unsqueeze(0)  # [B, T]
        positions = slots if tree is None else cache.lens.unsqueeze(1) + tree.depths.unsqueeze(0)
        if int(positions.max()) >= c.max_position_embeddings:
            raise ValueError(f"position {int(positions.max())} exceeds the model's context "
                             f"({c.max_position_embeddings} tokens)")
        cos = self.rope_cos[positions].unsqueeze(1)  # [B, 1, T, D]
        sin = self.rope_sin[positions].unsqueeze(1)
        mask, span = cache.attention_mask(T) if tree is None else cache.tree_mask(tree.ancestors)
        nq, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        hidden: dict[int, torch.Tensor] = {}
        x = F.embedding(input_ids, self.embed)  # [B, T, H]
        if self.fused_layers is not None and B * T <= small_gemm.MAX_ROWS:
            step = decoder_layer.Step.of(cos.reshape(B * T, d), sin.reshape(B * T, d),
                                         torch.arange(B).repeat_interleave(T), slots.reshape(-1),
                                         mask.expand(B, 1, T, span).reshape(B * T, span), cache.max_len)
            rows = x.view(B * T, c.hidden_size)
            for i, layer in enumerate(self.fused_layers):
                decoder_layer.run(layer, step, rows, cache.keys[i], cache.values[i])
                if i in hidden_layers:
                    hidden[i] = x.clone()
            return self._head(x, hidden, hidden_layers, logits)
        for i, w in enumerate(self.layers):
            h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
            qkv = w["qkv"](h)  # [B, T, (nq + 2 nkv) d]
            q, k, v = qkv.split([nq * d, nkv * d, nkv * d], dim=-1)
            q = q.view(B, T, nq, d)
            k = k.view(B, T, nkv, d)
            if w["q_norm"] is not None:
                q, k = rms_norm(q, w["q_norm"], c.rms_norm_eps), rms_norm(k, w["k_norm"], c.rms_norm_eps)
            q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, nq, T, d]
            k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, nkv, T, d]
            v = v.view(B, T, nkv, d).transpose(1, 2)
            cache.write(i, k, v, slots)
            keys, values = cache.keys[i][:, :, :span], cache.values[i][:, :, :span]
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=nq != nkv)
            x = x + w["o"](attn.transpose(1, 2).reshape(B, T, nq * d))
            h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
            gate, up = w["gate_up"](h).chunk(2, dim=-1)
            x = x + w["down"](F.silu(gate) * up)
            if i in hidden_layers:
                hidden[i] = x
        return self._head(x, hidden, hidden_layers, logits)

    def _head(self, x: torch.Tensor, hidden: dict[int, torch.Tensor], hidden_layers: tuple[int, ...],
              logits: bool) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
        """The final norm and the LM head over the last layer's residual stream x [B, T, H] (neither
        where nothing reads them)."""
        if not logits and -1 not in hidden_layers:
            return None, hidden
        x = rms_norm(x, self.final_norm, self.cfg.rms_norm_eps)
        if -1 in hidden_layers:
            hidden[-1] = x
        return (self.lm_head(x) if logits else None), hidden
