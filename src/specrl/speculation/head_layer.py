"""The decoder layer and chain attention shared by the hidden-state draft heads (EAGLE-3, MTP).

A head drafts a chain from an anchor e, the last position whose target hidden state is
known (its token t_{e+1} is known too). Chain element j (j = 1..K) sits at position
e + j - 1 and predicts t_{e+j+1}:

    element 1:  input (f_e, t_{e+1})            f = features fused from the target's hidden states
    element j:  input (g_{j-1}, d_{j-1})         g = the head's own output of the previous element

Element j attends to the head's cache of positions <= e (element-1 entries computed from
target features over the whole history) and to the chain's own entries e+1 .. e+j-1.

Training must see the same attention pattern (EAGLE-3's "training-time test"). With the
whole sequence in one batch, the depth-j pass computes element j for every anchor at once:
its row i is the element at position i of anchor e = i - j + 1, and it attends to

    depth-1 keys at s <= i - j + 1    and    depth-d keys at s == i - j + d,  d = 2..j.

Depth 1 runs over every position (its keys are every chain's context). Depth j >= 2 runs only
over the rows whose anchor counts, e >= `first_anchor` (`chain_rows`): the others have no loss,
and no row that counts reads their keys (a kept row reads depth d at s >= first_anchor + d - 1).
On RL's rollouts that skips the prompt, most of each sequence, at every depth but the first.
`chain_mask` builds the mask over those rows; `DraftDecoderLayer.forward_train` applies it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specrl.kernels import small_gemm
from specrl.models.kv_cache import KVCache
from specrl.models.llama import apply_rope, rms_norm


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class HeadLinear(nn.Linear):
    """nn.Linear that, when drafting on the fast path, applies its weight with specrl's small-row
    kernel as the target's projections do: a head drafts B (or B x width) rows per pass, exactly
    where MKL's small-row cliff costs ~2x. Training (autograd on) and passes of more than
    `small_gemm.MAX_ROWS` rows use F.linear. The packed copy is rebuilt whenever the weight
    changed: an optimizer step or a sync's copy_ bumps the tensor's version. A weight created under
    inference mode has no version to watch, so it stays on F.linear."""

    fast = False  # set by DraftHead.use_fast_path

    def repack(self) -> bool:
        """Rebuild the packed copy if the weight changed since it was made (off the fast path: nothing to pack).
        Returns whether it rebuilt."""
        if not self.fast or self.weight.is_inference():
            return False
        key = (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_packed_key", None) == key:
            return False
        self._packed, self._packed_key = small_gemm.pack(self.weight.detach()), key
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (not self.fast or torch.is_grad_enabled() or self.weight.is_inference()
                or x.numel() // x.shape[-1] > small_gemm.MAX_ROWS):
            return F.linear(x, self.weight, self.bias)
        self.repack()
        y = small_gemm.matmul(x, self._packed, self.out_features)
        return y if self.bias is None else y + self.bias


def chain_rows(seq_len: int, depth: int, first_anchor: int = 0) -> list[int]:
    """The first row each depth 1..depth computes: 0 for depth 1 (every position), and for depth d >= 2
    the row of anchor `first_anchor`, first_anchor + d - 1 (at most seq_len: then it computes none)."""
    return [0] + [min(first_anchor + d - 1, seq_len) for d in range(2, depth + 1)]


def chain_mask(seq_len: int, depth: int, first_anchor: int = 0) -> torch.Tensor:
    """[R, K] bool: which keys the depth-`depth` query at each of its rows attends to.

    Rows are i = a_depth .. seq_len-1 and keys are laid out depth-major, depth d holding positions
    a_d .. seq_len-1 (a = `chain_rows`). Example, S = 3, depth 2, first_anchor 0 (rows i = 1, 2;
    keys: depth-1 s = 0, 1, 2 | depth-2 s = 1, 2):
        i=1: depth-1 s <= 0    depth-2 s=1    -> [T F F | T F]
        i=2: depth-1 s <= 1    depth-2 s=2    -> [T T F | F T]
    """
    starts = chain_rows(seq_len, depth, first_anchor)
    i = torch.arange(starts[-1], seq_len).unsqueeze(1)  # [R, 1]
    blocks = [torch.arange(seq_len).unsqueeze(0) <= i - depth + 1]
    blocks += [torch.arange(starts[d - 1], seq_len).unsqueeze(0) == i - depth + d for d in range(2, depth + 1)]
    return torch.cat(blocks, dim=1)


class DraftDecoderLayer(nn.Module):
    """One Llama decoder layer whose attention input may be wider than the residual (EAGLE-3: 2H).

    forward returns the pre-norm residual stream after attention and MLP, the head's feature g.
    """

    def __init__(self, in_features: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 intermediate: int, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = HeadLinear(in_features, heads * head_dim, bias=False)
        self.k_proj = HeadLinear(in_features, kv_heads * head_dim, bias=False)
        self.v_proj = HeadLinear(in_features, kv_heads * head_dim, bias=False)
        self.o_proj = HeadLinear(heads * head_dim, hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.gate_proj = HeadLinear(hidden, intermediate, bias=False)
        self.up_proj = HeadLinear(hidden, intermediate, bias=False)
        self.down_proj = HeadLinear(intermediate, hidden, bias=False)

    @torch.no_grad()
    def copy_from(self, w: dict[str, torch.Tensor], column: int = 0) -> None:
        """Initialise from an engine layer `w` (LlamaModel.layers[i]); q/k/v read input columns
        column .. column+H (the rest start at zero)."""
        nq, nkv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        H = self.o_proj.weight.shape[0]
        for proj, src in zip((self.q_proj, self.k_proj, self.v_proj), w["qkv"].weight.split([nq, nkv, nkv], dim=0)):
            proj.weight.zero_()
            proj.weight[:, column:column + H] = src
        self.o_proj.weight.copy_(w["o"].weight)
        gate, up = w["gate_up"].weight.chunk(2, dim=0)
        self.gate_proj.weight.copy_(gate)
        self.up_proj.weight.copy_(up)
        self.down_proj.weight.copy_(w["down"].weight)
        self.post_attention_layernorm.weight.copy_(w["mlp_norm"])

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, in] -> q [B, h, T, d], k and v [B, h_kv, T, d] (q, k rotated)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn [B, h, T, d] -> o_proj, residual add, MLP, residual add: g [B, T, H]."""
        B, _, T, _ = attn.shape
        residual = residual + self.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
        h = self.post_attention_layernorm(residual)
        return residual + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def forward_cached(self, x: torch.Tensor, residual: torch.Tensor, cache: KVCache,
                       cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Inference: T new positions per row after `cache.lens` (x [B, T, in], residual [B, T, H])."""
        T = x.shape[1]
        positions = cache.lens.unsqueeze(1) + torch.arange(T).unsqueeze(0)  # [B, T]
        q, k, v = self._qkv(x, cos, sin)
        cache.write(0, k, v, positions)
        mask, span = cache.attention_mask(T)
        attn = F.scaled_dot_product_attention(q, cache.keys[0][:, :, :span], cache.values[0][:, :, :span],
                                              attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self._finish(attn, residual)

    def forward_train(self, x: torch.Tensor, residual: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]],
                      cos: torch.Tensor, sin: torch.Tensor, pad_mask: torch.Tensor, first_anchor: int = 0):
        """Training, depth j = len(past) + 1: its rows a_j .. S-1 at once (a = `chain_rows`; see `chain_mask`).

        x [B, R, in], residual [B, R, H], cos/sin for those R rows; past = the (k, v) of depths 1..j-1,
        depth d's [B, h_kv, S - a_d, d]; pad_mask [B, S] bool, True on real tokens (keys of padding
        are never attended; a padded query still sees its own key, so softmax is defined).
        Returns (g [B, R, H], (k, v) of this depth).
        """
        S, depth = pad_mask.shape[1], len(past) + 1
        starts = chain_rows(S, depth, first_anchor)
        q, k, v = self._qkv(x, cos, sin)
        keys = torch.cat([pk for pk, _ in past] + [k], dim=2)
        values = torch.cat([pv for _, pv in past] + [v], dim=2)
        key_real = torch.cat([pad_mask[:, a:] for a in starts], dim=1)  # [B, K]
        mask = chain_mask(S, depth, first_anchor).unsqueeze(0) & key_real.unsqueeze(1)  # [B, R, K]
        R = S - starts[-1]
        own = torch.zeros(R, keys.shape[2], dtype=torch.bool)
        own[torch.arange(R), keys.shape[2] - R + torch.arange(R)] = True
        mask = (mask | own).unsqueeze(1)  # [B, 1, R, K]
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self._finish(attn, residual), (k, v)
