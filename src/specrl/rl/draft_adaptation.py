"""Online draft adaptation: keep the draft in step with the drifting policy.

On the same rollouts the policy trains on, the draft is trained by soft
cross-entropy against the policy's detached next-token distribution at the
sampling temperature T:

    L_draft = - sum_t mask_t * sum_x p_T(x | <t) * log q_T(x | <t)  /  sum_t mask_t

with p_T = softmax(policy_logits / T) and q_T = softmax(draft_logits / T), the
distribution the draft samples its proposals from. Minimising it maximises the
expected acceptance sum_x min(p, q) in the limit q -> p. The draft has its own
optimiser; its weights are synced into the engine with the policy's, under the
same version. The draft never changes what is sampled, only how fast.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from specrl.finite_step import finite_step
from specrl.models.checkpoint import load_causal_lm, load_config
from specrl.rl.sequences import TrainBatch
from specrl.rl.trainer import sync_state_dict
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class DraftAdaptConfig:
    """Online draft training settings."""

    SECTION: ClassVar[str] = "draft"

    enabled: bool = True  # train the draft model or EAGLE-3/MTP head during RL (proposers draft, eagle3, mtp, hybrid)
    every: int = within(1, "[1, inf)")  # adapt on every N-th step's rollouts
    lr: float = within(3e-4, "(0, inf)")  # the draft's AdamW learning rate
    loss_weight: float = within(1.0, "(0, inf)")  # lambda: scales the draft loss (the seed system uses ~0.1 on a shared optimiser)
    depth: int = within(3, "[1, inf)")  # heads: chain elements trained per anchor (training-time test)
    depth_decay: float = within(0.8, "(0, 1]")  # heads: loss weight of depth j is depth_decay^(j-1)

    def __post_init__(self):
        check_fields(self)


def soft_cross_entropy(draft_logits: torch.Tensor, policy_logits: torch.Tensor,
                       temperature: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Over N positions ([N, V] each) -> (the sum of the soft CE, sums of KL(p || q) and of the expected
    acceptance sum_x min(p, q)). CE = H(p) + KL(p || q): only the KL depends on the draft."""
    log_p = (policy_logits / temperature).log_softmax(-1)
    log_q = (draft_logits / temperature).log_softmax(-1)
    p = log_p.exp()
    ce = -(p * log_q).sum(-1)  # [N]
    with torch.no_grad():
        kl = (p * (log_p - log_q)).sum(-1)
        acceptance = torch.minimum(p, log_q.exp()).sum(-1)
    return ce.sum(), {"kl": float(kl.sum()), "acceptance": float(acceptance.sum())}


class DraftTrainer:
    """A draft model adapted online (see the module docstring); `HeadTrainer` has the same interface."""

    hidden_layers: tuple[int, ...] = ()  # the draft reads no hidden states of the policy

    def __init__(self, checkpoint_dir, config: DraftAdaptConfig, temperature: float):
        if load_config(Path(checkpoint_dir)).draft_vocab_size:
            raise ValueError(f"{checkpoint_dir}: online adaptation of reduced-vocabulary drafts is not supported; "
                             "set draft.enabled=false or use a full-vocabulary draft")
        self.model = load_causal_lm(checkpoint_dir)
        self.model.train()
        self.config, self.temperature = config, temperature
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr)
        self._reset()

    def _reset(self) -> None:
        self.loss_sum, self.kl_sum, self.acceptance_sum, self.tokens = 0.0, 0.0, 0.0, 0.0
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return sync_state_dict(self.model)

    def save(self, out_dir: Path) -> None:
        self.model.save_pretrained(out_dir, safe_serialization=True)

    def accumulate(self, batch: TrainBatch, policy_logits: torch.Tensor, hidden: dict[int, torch.Tensor],
                   num_tokens: int) -> None:
        """Backward one micro-batch's draft loss (normalised by the whole batch's tokens). `policy_logits` [N, V]:
        the policy's at the positions where `batch.loss_mask` is 1, row-major (`PolicyTrainer.step`)."""
        counted = batch.loss_mask > 0
        draft_logits = self.model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits[counted].float()
        loss, sums = soft_cross_entropy(draft_logits, policy_logits, self.temperature)
        (self.config.loss_weight * loss / num_tokens).backward()
        self.loss_sum += float(loss.detach())
        self.kl_sum += sums["kl"]
        self.acceptance_sum += sums["acceptance"]
        self.tokens += float(counted.sum())

    def step(self) -> dict[str, float]:
        """Apply the accumulated gradient; returns the pre-update loss and expected acceptance."""
        _, skipped = finite_step(self.optimizer, list(self.model.parameters()), self.loss_sum, 1.0, "draft model")
        stats = {"draft_loss": self.loss_sum / max(self.tokens, 1), "draft_kl": self.kl_sum / max(self.tokens, 1),
                 "draft_expected_acceptance": self.acceptance_sum / max(self.tokens, 1),
                 "draft_step_skipped": int(skipped)}
        self._reset()
        return stats
