"""Online adaptation of an EAGLE-3 or MTP head: the head follows the drifting policy.

The head trains on what the policy's own GRPO forward pass computes anyway: its hidden
states (the layers the head reads) and its logits. No extra target pass is run. That pass is
packed (`rl.packing`): the head reads each row's hidden states gathered back into the padded
layout, the prompt's (computed once per group) then the row's own response's, equal at every
real position to a padded forward's; and the logits at the positions that predict a response
token, the only ones its loss reads.

Loss (the offline training-time test of `training.head_training`, on the RL batch): for
chain depth j = 1..D the head runs over every sequence at once (`DraftHead.forward_train`);
row i of depth j predicts ids[i + 2] from the anchor e = i - j + 1, and its teacher is the
policy's sampling distribution p at position i + 1 (temperature, top-k, top-p of the
rollouts: the distribution speculative sampling verifies against), restricted to the head's
output vocabulary and renormalised:

    L_head = sum_j w_j * sum_{valid (b, i)} CE(p_{b, i+1}, q_j(b, i))  /  (sum_j w_j * num_tokens)

w_j = depth_decay^(j-1); q = softmax(head logits / T), the untruncated draft the proposer
samples from; a row counts when it predicts a response token from an anchor at or after the
prompt's second-to-last position, as offline. The head reads the *policy's* embedding and
output head (`PolicyView`), detached: so it trains against the weights it will draft with.
Its weights are synced into the engine with the policy's, under the same version, in the
checkpoint layout it saves (`DraftHead.checkpoint_state`).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specrl.finite_step import finite_step

from specrl.models.checkpoint import load_config
from specrl.rl.draft_adaptation import DraftAdaptConfig
from specrl.rl.sequences import TrainBatch
from specrl.sampling import SamplingParams, sampling_logprobs
from specrl.speculation.draft_losses import soft_cross_entropy
from specrl.speculation.proposer_registry import load_head


class PolicyView:
    """What a head reads from its target (`cfg`, `embed`, `lm_head`, `source`), taken live and
    detached from the Hugging Face policy being trained."""

    def __init__(self, model, policy_dir: str | Path):
        self.model, self.source = model, str(policy_dir)
        self.cfg = load_config(Path(policy_dir))

    @property
    def embed(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight.detach()

    def lm_head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.model.get_output_embeddings().weight.detach())


class HeadTrainer:
    """An EAGLE-3 / MTP head adapted online; the same interface as `DraftTrainer`."""

    def __init__(self, head_dir, kind: str, policy_model, policy_dir, config: DraftAdaptConfig,
                 sampling: SamplingParams):
        self.head = load_head(head_dir, PolicyView(policy_model, policy_dir), kind)
        self.head.train()
        self.hidden_layers = self.head.hidden_layers
        self.config, self.sampling = config, sampling
        self.weights = [config.depth_decay ** j for j in range(config.depth)]
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=config.lr)
        self._reset()

    def _reset(self) -> None:
        self.loss_sum, self.weighted_rows = 0.0, 0.0
        self.acceptance_sum, self.rows = [0.0] * self.config.depth, [0.0] * self.config.depth
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.head.checkpoint_state()

    def save(self, out_dir: Path) -> None:
        self.head.save(out_dir)

    def _chain_terms(self, batch: TrainBatch, policy_logits: torch.Tensor, hidden: dict[int, torch.Tensor]):
        """Per depth j: (log q [P, V_out] at the P rows that count, the teacher p [P, V_out]). `policy_logits`
        [N, V] are the policy's at the positions where `batch.loss_mask` is 1, row-major (`PolicyTrainer.step`)."""
        head, d2t = self.head, self.head.d2t
        p_all = sampling_logprobs(policy_logits, self.sampling).exp()  # [N, V]: the p of each response token
        if d2t is not None:
            p_all = p_all.index_select(-1, d2t)
        slot = (batch.loss_mask.flatten().cumsum(0) - 1).long().view_as(batch.loss_mask)  # [B, S] -> row of p_all
        S = batch.ids.shape[1]
        predicts_response = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
        predicts_response[:, :S - 1] = batch.loss_mask[:, 1:] > 0  # row i predicts ids[i+2], a response token
        first = batch.loss_mask.argmax(1, keepdim=True)  # L - 1 per row
        g_per_depth = head.forward_train(hidden, batch.ids, batch.attention_mask.bool(), self.config.depth,
                                         first_anchor=max(int(first.min()) - 1, 0))
        rows = torch.arange(S).unsqueeze(0)
        for j, g in enumerate(g_per_depth):
            b, i = (predicts_response & (rows - j >= first - 1)).nonzero(as_tuple=True)  # anchor i - j >= L - 2
            logq = (head.logits(g[b, i]).float() / self.sampling.temperature).log_softmax(-1)
            yield logq, p_all[slot[b, i + 1]]

    def accumulate(self, batch: TrainBatch, policy_logits: torch.Tensor, hidden: dict[int, torch.Tensor],
                   num_tokens: int) -> None:
        """Backward one micro-batch's head loss (normalised by the whole batch's response tokens)."""
        loss = 0.0
        for j, (w, (logq, p)) in enumerate(zip(self.weights, self._chain_terms(batch, policy_logits, hidden))):
            ce = soft_cross_entropy(logq, p).sum()
            loss = loss + w * ce
            with torch.no_grad():
                self.acceptance_sum[j] += float(torch.minimum(p, logq.exp()).sum())
            self.rows[j] += p.shape[0]
            self.loss_sum += w * float(ce.detach())
            self.weighted_rows += w * p.shape[0]
        (self.config.loss_weight * loss / (sum(self.weights) * num_tokens)).backward()

    @torch.no_grad()
    def expected_acceptance(self, batch: TrainBatch, policy_logits: torch.Tensor,
                            hidden: dict[int, torch.Tensor]) -> list[tuple[float, int]]:
        """Per depth, (the mean of sum_x min(p, q) over the rows that count, their number); no update."""
        return [(float(torch.minimum(p, logq.exp()).sum(-1).mean()) if len(p) else 0.0, len(p))
                for logq, p in self._chain_terms(batch, policy_logits, hidden)]

    def step(self) -> dict[str, float]:
        """Apply the accumulated gradient; returns the pre-update loss and expected acceptance per depth."""
        _, skipped = finite_step(self.optimizer, list(self.head.parameters()), self.loss_sum, 1.0, f"{self.head.kind} head")
        stats = {"draft_loss": self.loss_sum / max(self.weighted_rows, 1.0), "draft_step_skipped": int(skipped)}
        for j, (a, n) in enumerate(zip(self.acceptance_sum, self.rows), start=1):
            stats[f"draft_expected_acceptance_depth{j}"] = a / max(n, 1)
        stats["draft_expected_acceptance"] = stats["draft_expected_acceptance_depth1"]
        self._reset()
        return stats
