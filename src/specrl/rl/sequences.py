"""Batches of prompt + response token ids for training and sampling small causal LMs.

Conventions shared by `pretrain` (tiny) and `distill` (smollm2 draft):
- training batches are right-padded; `loss_mask` is 1 on the positions whose *next*
  token is a response token (so logits[:, t] predicts ids[:, t + 1] where mask[:, t] = 1);
- sampling batches are left-padded with an attention mask, the layout `generate` wants.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel


@dataclass
class TrainBatch:
    ids: torch.Tensor  # [B, T] long, right-padded
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    loss_mask: torch.Tensor  # [B, T] float, 1 where logits[:, t] predicts a response token ids[:, t+1]

    def to(self, device: torch.device) -> "TrainBatch":
        return TrainBatch(self.ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device))


def train_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> TrainBatch:
    """Right-pad `prompt + response` rows and mark the positions that predict response tokens.

    Example: prompt [5, 6], response [7, 2], pad 0, longest row 5 ->
    ids [5, 6, 7, 2, 0], loss_mask [0, 1, 1, 0, 0] (position 1 predicts 7, position 2 predicts 2).
    """
    rows = [p + r for p, r in zip(prompts, responses)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attention[i, : len(p) + len(r)] = 1
        loss_mask[i, len(p) - 1 : len(p) + len(r) - 1] = 1.0
    return TrainBatch(ids, attention, loss_mask)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts: returns ids [B, T] and attention_mask [B, T]."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attention[i, width - len(p) :] = 1
    return ids, attention


@torch.no_grad()
def sample_responses(
    model: PreTrainedModel,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float,
    seed: int,
) -> list[list[int]]:
    """Sample one response per prompt with `generate`; temperature 0 means greedy.

    Each response ends with `eos_id` if the model stopped, and is cut there. Sampling is
    plain (no top-k / top-p), so at temperature 1 the samples follow the model's distribution.
    """
    ids, attention = left_pad(prompts, pad_id)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_k=None,
        top_p=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=attention, generation_config=config)
    responses = []
    for row in out[:, ids.shape[1] :].tolist():
        cut = row.index(eos_id) + 1 if eos_id in row else len(row)
        responses.append(row[:cut])
    return responses


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` [B, T] over positions where `mask` [B, T] is 1."""
    return (values * mask).sum() / mask.sum().clamp_min(1.0)
