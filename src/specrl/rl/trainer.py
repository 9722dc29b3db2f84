"""The policy trainer: one GRPO optimiser step on a Hugging Face `transformers` causal LM.

The batch is split into micro-batches whose gradients accumulate, so memory stays
bounded by `micro_batch_size` whatever the rollout batch. All micro-batches run on
the same (pre-update) weights, so the logprobs they compute are the trainer's
logprobs of the rollout tokens, compared with the engine's for the parity metrics.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from specrl.rl.sequences import TrainBatch, train_batch
from specrl.models.checkpoint import load_causal_lm
from specrl.rl.grpo import GRPOConfig, grpo_loss
from specrl.sampling import SamplingParams, sampling_logprobs
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class OptimConfig:
    """AdamW settings and micro-batching for the policy."""

    SECTION: ClassVar[str] = "optim"

    lr: float = within(1e-5, "(0, inf)")
    weight_decay: float = within(0.0, "[0, inf)")
    max_grad_norm: float = within(1.0, "[0, inf)")  # clip the global gradient norm; 0 = no clipping
    micro_batch_size: int = within(8, "[1, inf)")  # sequences per forward/backward

    def __post_init__(self):
        check_fields(self)


def sync_state_dict(model) -> dict[str, torch.Tensor]:
    """A model's weights under Hugging Face names, detached, for weight sync. A tied
    `lm_head.weight` is left out (it is `embed_tokens`): loaders re-tie it, and aliases
    cannot be serialised."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    return {k: v.detach() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


def response_logits(model, batch: TrainBatch) -> torch.Tensor:
    """Logits at every position [B, T, V] (position t predicts ids[:, t+1])."""
    return model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits.float()


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float, top_k: int = 0,
                   top_p: float = 1.0) -> torch.Tensor:
    """log p(ids[:, t+1] | ids[:, :t+1]) at position t -> [B, T] (last column 0), under the distribution
    the engine samples from: logits / temperature, truncated to top-k / top-p and renormalised."""
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    picked = sampling_logprobs(logits[:, :-1], params).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(picked, (0, 1))


def capture_hidden(model, layers: tuple[int, ...]):
    """Forward hooks that record, detached, the residual stream after each engine layer index in
    `layers` (-1 = the final normed state), the numbering of `LlamaModel.forward`. Returns
    (the dict they fill, a function that removes them)."""
    found: dict[int, torch.Tensor] = {}
    handles = []

    def keep(index):
        def hook(_module, _inputs, output):
            found[index] = (output[0] if isinstance(output, tuple) else output).detach()
        return hook

    for index in layers:
        module = model.model.norm if index == -1 else model.model.layers[index]
        handles.append(module.register_forward_hook(keep(index)))
    return found, lambda: [h.remove() for h in handles]


def align_per_token(values: list[list[float]], prompts: list[list[int]], width: int) -> torch.Tensor:
    """Per-response-token values placed where `train_batch`'s loss_mask is 1 -> [B, width]."""
    out = torch.zeros(len(values), width)
    for i, (row, prompt) in enumerate(zip(values, prompts)):
        out[i, len(prompt) - 1: len(prompt) - 1 + len(row)] = torch.tensor(row)
    return out


class PolicyTrainer:
    def __init__(self, checkpoint_dir, grpo: GRPOConfig, optim: OptimConfig, sampling: SamplingParams, pad_id: int):
        """`sampling`: the rollouts' temperature, top-k and top-p; logprobs are taken under that distribution."""
        if sampling.greedy:
            raise ValueError("training needs a sampling temperature > 0 (logprobs under greedy decoding are degenerate)")
        self.model = load_causal_lm(checkpoint_dir)
        self.model.train()
        self.reference = None
        if grpo.kl_coef > 0:
            self.reference = load_causal_lm(checkpoint_dir).eval()
        self.grpo, self.optim, self.sampling, self.pad_id = grpo, optim, sampling, pad_id
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)

    @property
    def _truncation(self) -> tuple[float, int, float]:
        return self.sampling.temperature, self.sampling.top_k, self.sampling.top_p

    def state_dict(self) -> dict[str, torch.Tensor]:
        return sync_state_dict(self.model)

    @torch.no_grad()
    def head_acceptance(self, head, prompts: list[list[int]], responses: list[list[int]]) -> list[float]:
        """Per depth, `head`'s expected acceptance against this policy on these sequences (no update)."""
        totals = None
        size = self.optim.micro_batch_size
        for start in range(0, len(prompts), size):
            batch = train_batch(prompts[start:start + size], responses[start:start + size], self.pad_id)
            hidden, release = capture_hidden(self.model, head.hidden_layers)
            try:
                logits = response_logits(self.model, batch)
            finally:
                release()
            part = [(a * n, n) for a, n in head.expected_acceptance(batch, logits, hidden)]
            totals = part if totals is None else [(x + a, m + n) for (x, m), (a, n) in zip(totals, part)]
        return [x / max(n, 1) for x, n in totals or []]

    def step(self, prompts: list[list[int]], responses: list[list[int]], behaviour_logprobs: list[list[float]],
             advantages: torch.Tensor, on_micro_batch=None, decoupled: bool = False,
             hidden_layers: tuple[int, ...] = ()) -> dict[str, float]:
        """One optimiser step. `on_micro_batch(batch, logits, hidden)` sees each micro-batch's detached
        policy logits and the hidden states after the engine layer indices `hidden_layers` (the
        draft or head adaptation trains on them: no extra forward pass). `decoupled` (a batch with
        stale tokens) uses the pre-update logprobs as the proximal policy (see `grpo_loss`)."""
        num_tokens = sum(len(r) for r in responses)
        stats = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        abs_err, max_err = 0.0, 0.0
        self.optimizer.zero_grad(set_to_none=True)
        size = self.optim.micro_batch_size
        for start in range(0, len(prompts), size):
            rows = slice(start, start + size)
            batch = train_batch(prompts[rows], responses[rows], self.pad_id)
            behaviour = align_per_token(behaviour_logprobs[rows], prompts[rows], batch.ids.shape[1])
            hidden, release = capture_hidden(self.model, hidden_layers if on_micro_batch else ())
            try:
                logits = response_logits(self.model, batch)
            finally:
                release()
            logprobs = token_logprobs(logits, batch.ids, *self._truncation)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = token_logprobs(response_logits(self.reference, batch), batch.ids, *self._truncation)
            loss, micro = grpo_loss(logprobs, behaviour, advantages[rows], batch.loss_mask, self.grpo,
                                    num_tokens=num_tokens, ref_logprobs=ref,
                                    proximal_logprobs=logprobs.detach() if decoupled else None)
            loss.backward()
            stats["loss"] += float(loss.detach())
            for key, value in micro.items():
                stats[key] = stats.get(key, 0.0) + value
            with torch.no_grad():
                err = (logprobs - behaviour).abs() * batch.loss_mask
                abs_err += float(err.sum())
                max_err = max(max_err, float(err.max()))
            if on_micro_batch is not None:
                on_micro_batch(batch, logits.detach(), hidden)
        if self.optim.max_grad_norm > 0:
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim.max_grad_norm))
        self.optimizer.step()
        stats["logprob_abs_error_mean"] = abs_err / max(num_tokens, 1)
        stats["logprob_abs_error_max"] = max_err
        return stats
