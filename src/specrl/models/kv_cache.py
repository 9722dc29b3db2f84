"""A preallocated KV cache with one length per row.

Rows of a speculative batch accept different numbers of drafts, so each row keeps
its own count of valid entries, `lens`. A forward pass of T new tokens writes their
keys and values at positions lens[b] .. lens[b]+T-1 and attends to keys < lens[b]+t+1.
Rolling back rejected drafts is just lowering `lens`: stale entries past it are
masked out and later overwritten.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def retired_rows_order(done: torch.Tensor) -> torch.Tensor:
    """The rows to keep when the rows with `done` [B] bool leave a batch, ordered so that fewest move: each
    kept row stays in its slot, but those past the new batch size, which fill the leaving rows' slots.

    Example: done [F, T, F, F, T, F] -> [0, 5, 2, 3] (row 5 moves into row 1's slot; rows 1 and 4 leave).
    """
    live = (~done).nonzero().flatten()
    order = torch.arange(live.numel())
    order[done[:live.numel()]] = live[live >= live.numel()]
    return order


@dataclass
class KVCache:
    keys: list[torch.Tensor]  # per layer [B, Hkv, S_max, D]
    values: list[torch.Tensor]  # per layer [B, Hkv, S_max, D]
    lens: torch.Tensor  # [B] long, valid entries per row

    @classmethod
    def allocate(cls, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int) -> "KVCache":
        shape = (batch, num_kv_heads, max_len, head_dim)
        return cls(
            keys=[torch.zeros(shape) for _ in range(num_layers)],
            values=[torch.zeros(shape) for _ in range(num_layers)],
            lens=torch.zeros(batch, dtype=torch.long),
        )

    @property
    def batch(self) -> int:
        return self.lens.shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (a [B'] index, repeats allowed), in that order.

        Without repeats, only the rows that change slot are copied (read first, then written), in place, and the
        tensors narrowed to the first B' rows: retiring rows moves few (`retired_rows_order`). With repeats (a
        GRPO group's), every layer is gathered anew."""
        if rows.unique().numel() == rows.numel():
            moved = (rows != torch.arange(rows.numel())).nonzero().flatten()  # destination slots
            for store in (*self.keys, *self.values):
                store[moved] = store[rows[moved]]
            width = rows.numel()
            self.keys, self.values = [k[:width] for k in self.keys], [v[:width] for v in self.values]
        else:
            self.keys = [k.index_select(0, rows) for k in self.keys]
            self.values = [v.index_select(0, rows) for v in self.values]
        self.lens = self.lens.index_select(0, rows)

    def grow_to(self, length: int) -> None:
        """Make room for positions < `length` (zero-padded). Proposer caches need it: a ragged feed
        writes junk past each shorter row's tokens, and a draft that sat out steps has more to feed."""
        if length > self.max_len:
            extra = length - self.max_len
            self.keys = [torch.nn.functional.pad(k, (0, 0, 0, extra)) for k in self.keys]
            self.values = [torch.nn.functional.pad(v, (0, 0, 0, extra)) for v in self.values]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Store k, v [B, Hkv, T, D] at `positions` [B, T]."""
        rows = torch.arange(k.shape[0]).unsqueeze(1)  # [B, 1]
        self.keys[layer].transpose(1, 2)[rows, positions] = k.transpose(1, 2)
        self.values[layer].transpose(1, 2)[rows, positions] = v.transpose(1, 2)

    def tree_mask(self, ancestors: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Like `attention_mask` for T new tokens forming a tree: token t sees the row's past
        (keys < lens[b]) and the new tokens s with ancestors[t, s] (ancestors [T, T] bool)."""
        T = ancestors.shape[0]
        span = int(self.lens.max()) + T
        if span > self.max_len:
            raise ValueError(f"KV cache overflow: need {span} positions, allocated {self.max_len}")
        key_pos = torch.arange(span).view(1, 1, 1, span)
        offset = key_pos - self.lens.view(-1, 1, 1, 1)  # [B, 1, 1, S]: key's index among the new tokens
        inside = (offset >= 0) & (offset < T)
        allowed = ancestors[torch.arange(T).view(1, 1, T, 1), offset.clamp(0, T - 1)]  # [B, 1, T, S]
        return (offset < 0) | (inside & allowed), span

    def move(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        """Copy each row's K/V from slots `source` [B, n] to slots `destination` [B, n] in every layer
        (a tree's accepted branch to the slots right after its root). Reads all before writing."""
        rows = torch.arange(self.batch).unsqueeze(1)
        for layer in range(len(self.keys)):
            for store in (self.keys[layer], self.values[layer]):
                view = store.transpose(1, 2)  # [B, S, Hkv, D]
                view[rows, destination] = view[rows, source]

    def attention_mask(self, num_new: int) -> tuple[torch.Tensor, int]:
        """Boolean mask [B, 1, T, S] (True = attend) and S, the key span to read.

        Query t of row b sees keys j < lens[b] + t + 1 (its past plus itself).
        """
        span = int(self.lens.max()) + num_new
        if span > self.max_len:
            raise ValueError(f"KV cache overflow: need {span} positions, allocated {self.max_len}")
        key_pos = torch.arange(span).view(1, 1, 1, span)
        limit = self.lens.view(-1, 1, 1, 1) + torch.arange(num_new).view(1, 1, num_new, 1)
        return key_pos <= limit, span
