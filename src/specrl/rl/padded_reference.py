"""The plain GRPO step on right-padded rows: the reference the packed trainer is checked and measured against.

Each sequence is its own row `prompt + response`, right-padded to the longest in its micro-batch of
`micro_batch_size` rows; the model computes logits [B, T, V] at every position and the loss reads
those that predict response tokens (`train_batch`'s loss mask). This is how the trainer computed
until it packed shared prompts (`rl.packing`); `PolicyTrainer.step` must give the same loss and
gradients to fp32 rounding (tests/test_packed_trainer.py), and `specrl bench trainer-step` times
both. One rank, no adaptation hooks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specrl.finite_step import finite_step
from specrl.rl.grpo import grpo_loss
from specrl.rl.sequences import train_batch
from specrl.rl.trainer import token_logprobs


def padded_token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float, top_k: int = 0,
                          top_p: float = 1.0) -> torch.Tensor:
    """log p(ids[:, t+1] | ids[:, :t+1]) at position t -> [B, T] (last column 0), under the distribution the
    engine samples from (`token_logprobs` on every position of padded rows)."""
    return F.pad(token_logprobs(logits[:, :-1], ids[:, 1:], temperature, top_k, top_p), (0, 1))


def align_per_token(values: list[list[float]], prompts: list[list[int]], width: int) -> torch.Tensor:
    """Per-response-token values placed where `train_batch`'s loss_mask is 1 -> [B, width]."""
    out = torch.zeros(len(values), width)
    for i, (row, prompt) in enumerate(zip(values, prompts)):
        out[i, len(prompt) - 1: len(prompt) - 1 + len(row)] = torch.tensor(row)
    return out


def padded_step(trainer, prompts: list[list[int]], responses: list[list[int]], behaviour_logprobs: list[list[float]],
                advantages: torch.Tensor, micro_batch_size: int, decoupled: bool = False,
                apply: bool = True) -> dict[str, float]:
    """One GRPO step of `trainer` (a `PolicyTrainer`: its model, reference, optimiser and settings) on padded rows.
    `apply=False` leaves the gradients in the parameters' `.grad` without stepping. -> loss, kl, grad_norm."""
    num_tokens, num_sequences = sum(len(r) for r in responses), len(responses)
    trainer.optimizer.zero_grad(set_to_none=True)
    total, kl = 0.0, 0.0
    advantages = advantages.to(trainer.device)
    for start in range(0, len(prompts), micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        batch = train_batch(prompts[rows], responses[rows], trainer.pad_id).to(trainer.device)
        behaviour = align_per_token(behaviour_logprobs[rows], prompts[rows], batch.ids.shape[1]).to(trainer.device)
        with trainer._autocast():
            logits = trainer.model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits.float()
        logprobs = padded_token_logprobs(logits, batch.ids, *trainer._truncation)
        ref = None
        if trainer.reference is not None:
            with torch.no_grad(), trainer._autocast():
                ref_logits = trainer.reference(input_ids=batch.ids, attention_mask=batch.attention_mask).logits.float()
                ref = padded_token_logprobs(ref_logits, batch.ids, *trainer._truncation)
        loss, micro = grpo_loss(logprobs, behaviour, advantages[rows], batch.loss_mask, trainer.grpo,
                                num_tokens=num_tokens, ref_logprobs=ref, num_sequences=num_sequences,
                                proximal_logprobs=logprobs.detach() if decoupled else None)
        loss.backward()
        total += float(loss.detach())
        kl += micro["kl"]
    stats = {"loss": total, "kl": kl}
    if apply:
        stats["grad_norm"], _ = finite_step(trainer.optimizer, list(trainer.model.parameters()), total,
                                            trainer.optim.max_grad_norm, "policy")
    return stats
