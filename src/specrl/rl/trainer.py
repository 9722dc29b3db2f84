"""The policy trainer: one GRPO optimiser step on a Hugging Face `transformers` causal LM.

The batch is split into micro-batches whose gradients accumulate, so memory stays bounded by
`micro_batch_tokens` whatever the rollout batch. Each micro-batch is one packed sequence in which
a group's prompt is computed once and its responses attend to it (`rl.packing`), and the LM head
runs only at the positions that predict a response token: the same loss as right-padded rows of
`prompt + response`, to fp32 rounding, on fewer tokens. All micro-batches run on the same
(pre-update) weights, so the logprobs they compute are the trainer's logprobs of the rollout
tokens, compared with the engine's for the parity metrics.

Where and how it computes:
    device       run.device: cpu or cuda (`specrl.device`; cuda without CUDA is an error)
    precision    optim.precision: fp32, or bf16 autocast around forward and loss with fp32
                 master weights, gradients and AdamW moments (the engine's logprobs stay fp32,
                 so the first update's ratio is exp(bf16 rounding), not 1)
    ranks        when torch.distributed is initialised with N > 1 ranks (`pipeline.trainer_group`
                 starts them on Ray), the model is sharded with FSDP2 (`fully_shard`: each decoder
                 layer, then the root, which holds the embeddings and the tied head); each rank
                 steps on its 1/N of the batch, with the whole batch's token count as the loss
                 denominator, so the reduce-scattered gradient is the whole batch's. Gradients are
                 synchronised once per step (on the last micro-batch).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from specrl.device import resolve_device
from specrl.finite_step import finite_step
from specrl.rl.packing import PackedBatch, micro_batches, pack
from specrl.rl.sequences import TrainBatch, train_batch
from specrl.models.checkpoint import load_causal_lm
from specrl.rl.grpo import GRPOConfig, grpo_loss
from specrl.sampling import SamplingParams, sampling_logprobs
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class OptimConfig:
    """AdamW settings and micro-batching for the policy."""

    SECTION: ClassVar[str] = "optim"
    REMOVED: ClassVar[dict[str, str]] = {
        "micro_batch_size": "micro-batches are sized in tokens: set optim.micro_batch_tokens"}

    lr: float = within(1e-5, "(0, inf)")  # AdamW learning rate, constant
    weight_decay: float = within(0.0, "[0, inf)")  # AdamW decoupled weight decay
    max_grad_norm: float = within(1.0, "[0, inf)")  # clip the global gradient norm; 0 = no clipping
    # tokens per forward/backward: a micro-batch packs whole groups, each prompt once (`rl.packing`)
    micro_batch_tokens: int = within(512, "[1, inf)")
    # fp32, or bf16 autocast (forward and loss in bf16, master weights, gradients and AdamW state in fp32)
    precision: Literal["fp32", "bf16"] = "fp32"

    def __post_init__(self):
        check_fields(self)


def sync_state_dict(model) -> dict[str, torch.Tensor]:
    """A model's weights under Hugging Face names, detached, for weight sync. A tied
    `lm_head.weight` is left out (it is `embed_tokens`): loaders re-tie it, and aliases
    cannot be serialised."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    return {k: v.detach() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


def packed_logits(model, packed: PackedBatch) -> torch.Tensor:
    """The logits at `packed.logit_positions` only [N, V], in float32: one forward over the packed sequence,
    with the LM head run at the N positions that predict a response token."""
    mask = packed.attention_mask(model.config._attn_implementation, torch.float32)
    out = model(input_ids=packed.ids, attention_mask=mask, position_ids=packed.positions,
                logits_to_keep=packed.logit_positions)
    return out.logits[0].float()


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_k: int = 0,
                   top_p: float = 1.0) -> torch.Tensor:
    """log p(target) under the distribution the engine samples from (logits / temperature, truncated to
    top-k / top-p and renormalised): logits [..., V], targets [...] -> [...]."""
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    return sampling_logprobs(logits, params).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


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


def per_response_token(values: list[list[float]], packed: PackedBatch) -> torch.Tensor:
    """Per-response-token values of `packed`'s rows, as [R, L] (0 off the response tokens)."""
    out = torch.zeros(packed.response_mask.shape)
    for i, row in enumerate(values):
        out[i, :len(row)] = torch.tensor(row)
    return out


def padded_views(prompts: list[list[int]], responses: list[list[int]], packed: PackedBatch, logits: torch.Tensor,
                 hidden: dict[int, torch.Tensor], pad_id: int) -> tuple[TrainBatch, torch.Tensor, dict]:
    """What draft and head adaptation read, from a packed forward: the rows as a right-padded `TrainBatch`, the
    logits [N, V] (detached; row-major over its loss mask, the packed order), and each hidden state [1, T, H]
    gathered into the padded layout [R, W, H] (a prompt's states are shared by its rows; padding positions hold
    a copy of the first token's)."""
    rows = packed.rows
    batch = train_batch(prompts[rows.start:rows.stop], responses[rows.start:rows.stop], pad_id).to(logits.device)
    return batch, logits.detach(), {layer: h[0][packed.unpack_index] for layer, h in hidden.items()}


def with_parity_mean(stats: dict) -> dict:
    """stats with `logprob_abs_error_mean`: the engine-vs-trainer |logprob error| averaged over `parity_tokens`,
    the response tokens both score finitely (the tokens the trainer's truncation excludes are counted
    apart, in `excluded_tokens`). Ranks report sums; `combine_stats` calls this again on their total."""
    return {**stats, "logprob_abs_error_mean": stats["logprob_abs_error_sum"] / max(stats["parity_tokens"], 1)}


def check_sampling(sampling: SamplingParams) -> None:
    if sampling.greedy:
        raise ValueError("training needs a sampling temperature > 0 (logprobs under greedy decoding are degenerate)")


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter or state gathered whole, on the CPU (a collective: every rank calls it)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().cpu()


class PolicyTrainer:
    def __init__(self, checkpoint_dir, grpo: GRPOConfig, optim: OptimConfig, sampling: SamplingParams, pad_id: int,
                 device: str = "cpu"):
        """`sampling`: the rollouts' temperature, top-k and top-p; logprobs are taken under that distribution."""
        check_sampling(sampling)
        self.device = resolve_device(device)
        self.ranks = dist.get_world_size() if dist.is_initialized() else 1
        self.model = load_causal_lm(checkpoint_dir).to(self.device)
        if self.ranks > 1:
            from torch.distributed.fsdp import fully_shard

            for layer in self.model.model.layers:
                fully_shard(layer)
            fully_shard(self.model)
        self.model.train()
        self.reference = None
        if grpo.kl_coef > 0:
            self.reference = load_causal_lm(checkpoint_dir).to(self.device).eval()
        self.grpo, self.optim, self.sampling, self.pad_id = grpo, optim, sampling, pad_id
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)

    @property
    def _truncation(self) -> tuple[float, int, float]:
        return self.sampling.temperature, self.sampling.top_k, self.sampling.top_p

    def _autocast(self):
        if self.optim.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights under Hugging Face names, whole and on the CPU (gathered from the ranks)."""
        return {name: full_tensor(tensor) for name, tensor in sync_state_dict(self.model).items()}

    def save_policy(self, folder) -> None:
        """The policy in Hugging Face layout, gathered from the ranks; rank 0 writes."""
        state = self.state_dict()
        if self.ranks == 1 or dist.get_rank() == 0:
            self.model.save_pretrained(folder, state_dict=state, safe_serialization=True)

    def _names(self) -> list[str]:
        return [name for name, _ in self.model.named_parameters()]

    def optimizer_state(self) -> dict:
        """AdamW's state in torch's unsharded layout (parameters numbered in `named_parameters` order),
        whatever the number of ranks: checkpoints of 1 and N ranks are interchangeable."""
        if self.ranks == 1:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full = get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(full_state_dict=True))
        index = {name: i for i, name in enumerate(self._names())}
        return {"state": {index[name]: {key: full_tensor(v) if torch.is_tensor(v) else v for key, v in slots.items()}
                          for name, slots in full["state"].items()},
                "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                                 for group in full["param_groups"]]}

    def load_optimizer_state(self, state: dict) -> None:
        """Load what `optimizer_state` returned (sharded across the ranks when there are several)."""
        if self.ranks == 1:
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = self._names()
        full = {"state": {names[int(i)]: slots for i, slots in state["state"].items()},
                "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                                 for group in state["param_groups"]]}
        set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=full,
                                 options=StateDictOptions(full_state_dict=True))

    def _forward(self, packed: PackedBatch, layers: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The policy's packed forward: its logits at the response-predicting positions, and the hidden states
        after the engine layer indices `layers` (`capture_hidden`)."""
        hidden, release = capture_hidden(self.model, layers)
        try:
            return packed_logits(self.model, packed), hidden
        finally:
            release()

    @torch.no_grad()
    def head_acceptance(self, head, prompts: list[list[int]], responses: list[list[int]]) -> list[float]:
        """Per depth, `head`'s expected acceptance against this policy on these sequences (no update)."""
        totals = None
        for rows in micro_batches(prompts, responses, self.optim.micro_batch_tokens):
            packed = pack(prompts, responses, rows, self.optim.micro_batch_tokens).to(self.device)
            logits, hidden = self._forward(packed, head.hidden_layers)
            part = [(a * n, n) for a, n in head.expected_acceptance(*padded_views(prompts, responses, packed, logits,
                                                                                   hidden, self.pad_id))]
            totals = part if totals is None else [(x + a, m + n) for (x, m), (a, n) in zip(totals, part)]
        return [x / max(n, 1) for x, n in totals or []]

    def step(self, prompts: list[list[int]], responses: list[list[int]], behaviour_logprobs: list[list[float]],
             advantages: torch.Tensor, on_micro_batch=None, decoupled: bool = False,
             hidden_layers: tuple[int, ...] = (), num_tokens: int | None = None,
             num_sequences: int | None = None) -> dict[str, float]:
        """One optimiser step. `on_micro_batch(batch, logits, hidden)` sees each micro-batch's rows as a padded
        `TrainBatch`, the policy's detached logits at its response-predicting positions [N, V] (in the order of
        `batch.loss_mask`'s nonzeros, row-major) and the hidden states after the engine layer indices
        `hidden_layers`, laid out as `batch` [R, W, H] (the draft or head adaptation trains on them: no extra
        forward pass). `decoupled` (a batch with stale tokens) uses the pre-update logprobs as the proximal
        policy (see `grpo_loss`). With several ranks each passes its own rows and the whole batch's `num_tokens`
        and `num_sequences`; the stats are then this rank's shares (sums over ranks give the batch's; see
        `TrainerGroup`)."""
        num_tokens = num_tokens if num_tokens is not None else sum(len(r) for r in responses)
        num_sequences = num_sequences if num_sequences is not None else len(responses)
        stats = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "excluded_tokens": 0}
        abs_err, max_err, parity_tokens = 0.0, 0.0, 0
        self.optimizer.zero_grad(set_to_none=True)
        parts = micro_batches(prompts, responses, self.optim.micro_batch_tokens)
        runs = self._micro_batch_count(len(parts))
        advantages = advantages.to(self.device)
        for index in range(runs):
            if self.ranks > 1:  # reduce-scatter the gradients once, on the last micro-batch
                self.model.set_requires_gradient_sync(index == runs - 1)
            idle = index >= len(parts)  # a rank with fewer micro-batches repeats one with no loss (see below)
            rows = parts[-1 if idle else index]
            packed = pack(prompts, responses, rows, self.optim.micro_batch_tokens).to(self.device)
            with self._autocast():
                logits, hidden = self._forward(packed, hidden_layers if on_micro_batch else ())
            if idle:  # every rank runs the same collectives; this one adds nothing to the gradient
                (logits.sum() * 0.0).backward()
                continue
            logprobs = packed.scatter(token_logprobs(logits, packed.targets, *self._truncation))
            behaviour = per_response_token([behaviour_logprobs[i] for i in rows], packed).to(self.device)
            ref = None
            if self.reference is not None:
                with torch.no_grad(), self._autocast():
                    ref = packed.scatter(token_logprobs(packed_logits(self.reference, packed), packed.targets,
                                                        *self._truncation))
            mask = packed.response_mask.to(logprobs.dtype)
            loss, micro = grpo_loss(logprobs, behaviour, advantages[rows.start:rows.stop], mask, self.grpo,
                                    num_tokens=num_tokens, ref_logprobs=ref, num_sequences=num_sequences,
                                    proximal_logprobs=logprobs.detach() if decoupled else None)
            (loss * self.ranks).backward()  # FSDP averages the ranks' gradients; each holds a share of the sum
            stats["loss"] += float(loss.detach())
            for key, value in micro.items():
                stats[key] = stats.get(key, 0.0) + value
            with torch.no_grad():  # over the tokens both sides score finitely (a NaN or -inf must not hide)
                counted = packed.response_mask & torch.isfinite(logprobs) & torch.isfinite(behaviour)
                err = torch.where(counted, logprobs - behaviour, 0.0).abs()
                abs_err += float(err.sum())
                max_err = max(max_err, float(err.max()))
                parity_tokens += int(counted.sum())
            if on_micro_batch is not None:
                on_micro_batch(*padded_views(prompts, responses, packed, logits, hidden, self.pad_id))
        stats["grad_norm"], skipped = finite_step(self.optimizer, list(self.model.parameters()), stats["loss"],
                                                  self.optim.max_grad_norm, "policy")
        stats["policy_step_skipped"] = int(skipped)
        stats.update(logprob_abs_error_sum=abs_err, logprob_abs_error_max=max_err, parity_tokens=parity_tokens)
        return with_parity_mean(stats)

    def _micro_batch_count(self, mine: int) -> int:
        """How many forward/backward passes this step runs: its own micro-batches, or, with several ranks, the
        most any rank has (FSDP's gathers are collectives, so every rank runs the same number)."""
        if self.ranks == 1:
            return mine
        count = torch.tensor([mine], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count)
