"""`specrl train-draft`: distil a reduced-vocabulary draft model for a target on its own rollouts.

What it does, in order (every step seeded, CPU threads set on purpose):
1. Rollouts (`rollout_data`): the engine samples the target at temperature 1 on its RL preset's
   prompts, keeping p's top-k at every response position (a saved collection is loaded with
   `--rollouts DIR`; the same one trains heads).
2. Draft vocabulary: the N target ids with the largest expected count sum_t p_t(x) over
   the training positions (soft counts: they cover the most probability mass, unlike raw
   counts of the sampled tokens). `d2t` maps draft ids to them.
3. Distillation: the draft (see `reduced_vocab`: target embeddings + first `layers`
   layers + final norm + the N lm_head rows) is trained with soft cross-entropy
   -sum_x p~(x) log q(x), p~ = p restricted to the draft's support and renormalised.
   Training positions keep p's top `top_k` entries (their mass is reported); held-out
   positions read p in full, so the held-out metrics are exact.
   The input embedding stays frozen (it is the target's, and is not saved: the draft shares it).
4. Held-out metrics before and after: the loss above, top-1 agreement, and the expected
   acceptance of one drafted token sum_x min(p(x), q(x)).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specrl.models.checkpoint import load_causal_lm, save_atomically
from specrl.models.reduced_vocab import build_draft, save_draft
from specrl.rl.sequences import train_batch
from specrl.speculation.draft_losses import soft_cross_entropy
from specrl.training.loop import FitResult, Saving, Work, fit, indexed, shuffled_batches
from specrl.training.rollout_data import RolloutDataConfig, Rollouts, draft_vocabulary, full_distributions, sample_target
from specrl.validation import check_fields, within


@dataclass
class TrainDraftConfig:
    """Settings of `specrl train-draft --kind draft`; the defaults fit ~10 minutes on 2 cores.

    layers: decoder layers of the draft (initialised from the target's first layers).
    draft_vocab: N, the size of the draft's output vocabulary.
    steps: optimiser steps of distillation (cycling over the samples in shuffled passes).
    train_seconds: distillation stops after this many seconds, even if steps remain.
    lr: peak AdamW learning rate (linear warm-up over 10 steps, cosine to lr / 10).
    micro_batch: sequences per optimiser step.
    seed: seeds prompts, sampling and data order.
    threads: torch CPU threads.
    data: how the target's rollouts are sampled.
    """

    layers: int = within(2, "[1, inf)")
    draft_vocab: int = within(8192, "[1, inf)")
    steps: int = within(200, "[1, inf)")
    train_seconds: float = within(150.0, "(0, inf)")
    lr: float = within(1e-3, "(0, inf)")
    micro_batch: int = within(8, "[1, inf)")
    seed: int = 0
    threads: int = within(1, "[1, inf)")
    data: RolloutDataConfig = field(default_factory=RolloutDataConfig)

    def __post_init__(self) -> None:
        check_fields(self)


def _flat_targets(samples: Rollouts, idx: list[int], d2t: torch.Tensor, t2d: torch.Tensor,
                  full_p: list[torch.Tensor] | None = None) -> torch.Tensor:
    """p over the draft vocabulary at every response position of samples `idx`, flattened: [P, N].

    Rows are in the order of `train_batch(...).loss_mask.nonzero()` (sample by sample, step by
    step). Not renormalised: each row sums to p's mass on the draft's support (given `full_p`, the
    held-out full distributions, exactly; else the stored top-k entries).
    """
    rows = []
    for i in idx:
        if full_p is not None:
            rows.append(full_p[i][:, d2t].float())
        else:
            ids = t2d[samples.top_ids[i].long()]  # [steps, k], -1 outside the support
            vals = samples.top_p[i].float() * (ids >= 0)
            rows.append(torch.zeros(ids.shape[0], d2t.numel()).scatter_add_(-1, ids.clamp_min(0), vals))
    return torch.cat(rows)


def _draft_logq(draft, samples: Rollouts, idx: list[int]) -> torch.Tensor:
    """The draft's log q at the same flattened response positions: [P, N].

    The decoder runs over prompt + response, but the output head only over response
    positions (the prompt is given, never drafted), which saves most of the head's cost.
    """
    batch = train_batch([samples.ids[i][:samples.prompt_lens[i]].tolist() for i in idx],
                        [samples.ids[i][samples.prompt_lens[i]:].tolist() for i in idx], pad_id=0)
    hidden = draft.model(input_ids=batch.ids, attention_mask=batch.attention_mask).last_hidden_state
    return torch.log_softmax(draft.lm_head(hidden[batch.loss_mask.bool()]).float(), dim=-1)


def _metrics(draft, samples: Rollouts, full_p: list[torch.Tensor], d2t: torch.Tensor, t2d: torch.Tensor,
             micro_batch: int) -> dict[str, float]:
    """Exact held-out means: loss (p renormalised on the support), top-1 agreement with the
    target's argmax over the full vocabulary, acceptance sum_x min(p, q), and coverage (p's
    mass on the support, the ceiling of acceptance)."""
    tot = {"loss": 0.0, "top1": 0.0, "acceptance": 0.0, "coverage": 0.0}
    positions = 0
    draft.eval()
    with torch.no_grad():
        for s in range(0, len(samples), micro_batch):
            idx = list(range(s, min(s + micro_batch, len(samples))))
            p = _flat_targets(samples, idx, d2t, t2d, full_p)  # [P, N]
            logq = _draft_logq(draft, samples, idx)  # [P, N]
            mass = p.sum(-1)
            full_top = torch.cat([full_p[i].float().argmax(-1) for i in idx])  # [P]
            tot["loss"] += float(-(p / mass.clamp_min(1e-12).unsqueeze(-1) * logq).sum())
            tot["acceptance"] += float(torch.minimum(p, logq.exp()).sum())
            tot["coverage"] += float(mass.sum())
            tot["top1"] += float((d2t[logq.argmax(-1)] == full_top).sum())
            positions += p.shape[0]
    return {k: v / max(positions, 1) for k, v in tot.items()}


def _distil(draft, samples: Rollouts, d2t: torch.Tensor, t2d: torch.Tensor, config: TrainDraftConfig,
            saving: Saving | None = None) -> FitResult:
    """Soft cross-entropy training (resumed from and saved to `saving`, when given)."""
    for p in draft.model.embed_tokens.parameters():
        p.requires_grad_(False)

    def loss_of(idx: list[int]) -> torch.Tensor:
        p = _flat_targets(samples, idx, d2t, t2d)
        return soft_cross_entropy(_draft_logq(draft, samples, idx), p).mean()

    draft.train()
    batch_at = indexed(shuffled_batches(len(samples), config.micro_batch, config.seed + 7,
                                        lengths=[len(ids) for ids in samples.ids]))
    result = fit([p for p in draft.parameters() if p.requires_grad], lambda step: loss_of(batch_at(step)),
                 config.steps, config.lr, 10, "distil draft", seconds=config.train_seconds, saving=saving)
    draft.eval()
    return result


def train_draft(target_name: str, target_path: Path, out: Path, config: TrainDraftConfig,
                rollouts_dir: Path | None = None, command: str = "", work: Work | None = None) -> dict:
    """Sample (or load) the target's rollouts, choose the vocabulary, distil, evaluate, and save the draft
    to `out` (atomically; fp16, without the embedding it shares with the target). With `work`, the rollouts
    and the training state are kept in its folder and resumed from it; a sitting that ends before the
    budget returns {"finished": False, ...} and saves no draft."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    t0 = time.perf_counter()
    try:
        torch.manual_seed(config.seed)
        samples = sample_target(target_name, target_path, config.data, config.seed,
                                rollouts_dir or (work.rollouts if work else None))
        full_p = full_distributions(samples.target, samples.held)
        n = min(config.draft_vocab, samples.target.cfg.vocab_size)
        d2t, t2d = draft_vocabulary(samples.soft_counts, n)
        draft = build_draft(load_causal_lm(target_path).eval(), config.layers, d2t)
        before = _metrics(draft, samples.held, full_p, d2t, t2d, config.micro_batch)
        result = _distil(draft, samples.train, d2t, t2d, config, work.saving(draft) if work else None)
        if not result.finished:
            return work.unfinished(result)
        after = _metrics(draft, samples.held, full_p, d2t, t2d, config.micro_batch)
    finally:
        torch.set_num_threads(threads)
    train = samples.train
    summary = {
        "target": str(target_path), "layers": config.layers, "draft_vocab": n,
        "train_samples": len(train), "train_tokens": train.tokens, "held_out_tokens": samples.held.tokens,
        "top_k_mass": round(float(sum(x.float().sum() for x in train.top_p) / max(train.tokens, 1)), 4),
        "vocab_coverage_held_out": round(after["coverage"], 4),
        "loss_before": round(before["loss"], 4), "loss_after": round(after["loss"], 4),
        "top1_before": round(before["top1"], 4), "top1_after": round(after["top1"], 4),
        "acceptance_before": round(before["acceptance"], 4), "acceptance_after": round(after["acceptance"], 4),
        "train_loss_final": round(result.loss, 4), "train_steps": result.steps,
        "sample_seconds": round(samples.sample_seconds, 1), "seconds": round(time.perf_counter() - t0, 1),
    }
    save_atomically(Path(out), lambda tmp: (save_draft(draft, tmp, dtype=torch.float16, share_embeddings=True),
                                            samples.tokenizer.save_pretrained(tmp)),
                    {"command": command, "config": asdict(config), "summary": summary})
    return {**summary, "finished": True, "out": str(Path(out).resolve())}
