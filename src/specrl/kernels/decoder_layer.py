"""One decoder layer in one call (`decoder_layer.cpp`, built into the small-row kernels' library).

At the row counts of decoding, verification and drafting, the ~35 small PyTorch operations around a
layer's four projections add a dispatch cost of the same order as the projections' own streaming, a larger
share still of the int8 self-draft's cheaper pass (measured in docs/fast_path.md, "One forward pass").
`LlamaModel.forward` runs each layer as one call instead wherever every projection is on the fast path and
the rows fit the kernels.

    layer = Layer.of(weights, cfg)           once per weight load (holds pointers into `weights`)
    step = Step.of(cos, sin, batch_row, slot, mask, max_len)   once per forward pass
    run(layer, step, x, keys, values)        x [M, H] updated in place; K/V written into the cache

The tensors a `Layer` or `Step` points into must outlive it: `Layer.of` keeps the layer's weights
and `Step.of` its arguments.
"""
from __future__ import annotations

import ctypes

import torch

from specrl.kernels import small_gemm

_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class _Weight(ctypes.Structure):
    _fields_ = [("packed", _p), ("scales", _p), ("n_blocks", _i), ("block", _i), ("vnni", _i)]


def _weight(projection) -> _Weight:
    """A packed `Projection` or `Int8Projection` (fp32 weights when it has no `scales`; uint8 ones for the integer
    kernels: vnni 1 for the VNNI kernel, 2 for the AVX2 one, 3 for the 256-bit VNNI one)."""
    packed = projection.packed
    scales = getattr(projection, "scales", None)
    integer = 0 if packed.dtype != torch.uint8 else {"vnni": 1, "avx2-int8": 2, "avx-vnni": 3}[projection.kernel]
    return _Weight(packed.data_ptr(), None if scales is None else scales.data_ptr(), packed.shape[0], packed.shape[2],
                   integer)


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


class Layer(ctypes.Structure):
    _fields_ = [("attn_norm", _p), ("mlp_norm", _p), ("q_norm", _p), ("k_norm", _p), ("qkv_bias", _p),
                ("qkv", _Weight), ("o", _Weight), ("gate_up", _Weight), ("down", _Weight),
                ("hidden", _i), ("heads", _i), ("kv_heads", _i), ("head_dim", _i), ("intermediate", _i),
                ("eps", _f)]

    @classmethod
    def of(cls, weights: dict, cfg) -> "Layer":
        """`weights`: one entry of `LlamaModel.layers`, every projection packed for the kernels. The norms and
        the bias are read through contiguous fp32 copies where they are not so already (a synced state dict
        may hold views)."""
        vectors = [None if v is None else v.float().contiguous()
                   for v in (weights["attn_norm"], weights["mlp_norm"], weights["q_norm"], weights["k_norm"],
                             weights["qkv"].bias)]
        layer = cls(*map(_pointer, vectors), *(_weight(weights[name]) for name in ("qkv", "o", "gate_up", "down")),
                    cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                    cfg.intermediate_size, cfg.rms_norm_eps)
        layer.keep = (weights, vectors)
        return layer


class Step(ctypes.Structure):
    _fields_ = [("rows", _i), ("span", _i), ("max_len", _i), ("threads", _i), ("cos", _p), ("sin", _p),
                ("batch_row", _p), ("slot", _p), ("mask", _p)]

    @classmethod
    def of(cls, cos: torch.Tensor, sin: torch.Tensor, batch_row: torch.Tensor, slot: torch.Tensor,
           mask: torch.Tensor, max_len: int) -> "Step":
        """cos, sin [M, D] fp32; batch_row, slot [M] long; mask [M, span] bool (True = attend)."""
        rows, span = mask.shape
        keep = torch.zeros(rows, -(-span // 8) * 8)  # 1 = attend, padded with 0 to whole blocks of 8 keys
        keep[:, :span] = mask
        kept = (cos.contiguous(), sin.contiguous(), batch_row.contiguous(), slot.contiguous(), keep)
        step = cls(rows, span, max_len, torch.get_num_threads(), *(t.data_ptr() for t in kept))
        step.keep = kept
        return step


def supported(weights: dict, cfg) -> bool:
    """Whether the layer can run in one call: every projection packed for the kernels, no bias but the qkv
    one (`LlamaModel` loads none other), and a head dim that is a multiple of 8 and at most 512."""
    projections = [weights[name] for name in ("qkv", "o", "gate_up", "down")]
    return (not small_gemm.unavailable() and all(w.packed is not None for w in projections)
            and all(w.bias is None for w in projections[1:]) and cfg.head_dim % 8 == 0 and cfg.head_dim <= 512)


def run(layer: Layer, step: Step, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    """One layer over x [M, H] (contiguous fp32, updated in place), writing K/V into keys/values [B, Hkv, S_max, D]."""
    if not (x.is_contiguous() and keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("the decoder layer kernel needs contiguous activations and KV cache")
    if small_gemm._library()[0].specrl_decoder_layer(ctypes.byref(layer), ctypes.byref(step), x.data_ptr(),
                                                     keys.data_ptr(), values.data_ptr()):
        raise ValueError(f"the decoder layer kernel does not support head_dim {layer.head_dim} (a multiple of 8, "
                         "at most 512)")
