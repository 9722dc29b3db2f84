"""A proposer slot that never proposes: it records the target's hidden states for head training.

Head training (`specrl.training.head_training`) samples the target with this recorder in
the engine's proposer slot, so the hidden states the engine computes anyway (prefill and
decode) become each rollout's features at no extra forward pass.
"""
from __future__ import annotations

import torch

from specrl.speculation.proposer import CallScopedState


class HiddenStateRecorder(CallScopedState):
    """A proposer that never proposes: it records the target hidden states the engine hands to
    `observe`, per output slot, so a plain generate() also yields each rollout's features.

    Slots follow the engine's row order: P prompt rows at `start`, repeated n times by the first
    `select_rows`, then shrinking as rows finish (finished rows keep their records).
    """

    name = "recorder"

    def __init__(self, layers: tuple[int, ...]):
        self.hidden_layers = tuple(layers)
        self.records: dict[int, list[dict[int, torch.Tensor]]] = {}  # slot -> chunks {layer: [c, H]} in order

    def start(self, tokens, num_tokens, params) -> None:
        self.live = list(range(tokens.shape[0]))  # live row -> slot (prompt index until replicated)
        self.prompt_chunks: list[list[dict]] | None = [[] for _ in self.live]
        self.records = {}

    def select_rows(self, rows: torch.Tensor) -> None:
        rows = rows.tolist()
        if self.prompt_chunks is not None:  # the replication of prompts into their n samples
            self.records = {slot: list(self.prompt_chunks[prompt]) for slot, prompt in enumerate(rows)}
            self.live, self.prompt_chunks = list(range(len(rows))), None
            return
        self.live = [self.live[r] for r in rows]

    def observe(self, hidden, start, count, tokens) -> None:
        for row, c in enumerate(count.tolist()):
            chunk = {layer: h[row, :c].half() for layer, h in hidden.items()}
            if self.prompt_chunks is not None:
                self.prompt_chunks[row].append(chunk)
            else:
                self.records[self.live[row]].append(chunk)

    def restart(self, tokens, num_tokens, params, hidden) -> None:
        raise RuntimeError("HiddenStateRecorder: weights changed mid-call; a rollout's features would mix versions")

    def propose(self, context, k):
        raise RuntimeError("HiddenStateRecorder never proposes (run it with num_speculative_tokens=0)")

    def features(self, slot: int, length: int) -> dict[int, torch.Tensor]:
        """{layer: [length, H]} fp16: hidden states of positions 0..length-1 of one rollout."""
        chunks = self.records[slot]
        return {layer: torch.cat([c[layer] for c in chunks])[:length] for layer in self.hidden_layers}
