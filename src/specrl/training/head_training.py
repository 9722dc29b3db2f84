"""`specrl train-draft --kind eagle3|mtp`: train a hidden-state draft head on the target's own rollouts.

What it does, in order (seeded; CPU threads set on purpose):
1. Rollouts (`rollout_data`): the engine samples the target at temperature 1 on its RL preset's
   prompts, recording the hidden states it computes anyway, and p's top-k at every response
   position; or a saved collection is loaded (`--rollouts DIR`).
2. EAGLE-3's reduced output vocabulary is the N ids with the largest expected count
   sum_t p_t(x) (`d2t`).
3. Training-time test (see `speculation.head_layer`): the head runs chain elements 1..depth over
   every sequence at once and is trained with soft cross-entropy against p, restricted to
   its support and renormalised, depth j weighted by decay^(j-1). Only anchors the engine
   drafts from (the prompt's last position onwards) count.
4. Held-out prompts (other seeds), exactly: per depth, the loss and the expected acceptance
   sum_x min(p(x), q(x)) of a draft drawn from q, before and after training.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch

from specrl.models.checkpoint import save_atomically
from specrl.models.llama import LlamaModel
from specrl.speculation.draft_head import DraftHead
from specrl.speculation.draft_losses import rejection, soft_cross_entropy
from specrl.speculation.proposer_registry import HEAD_KINDS, load_head
from specrl.training.loop import FitResult, Saving, Work, fit, indexed, shuffled_batches
from specrl.training.rollout_data import (RolloutDataConfig, Rollouts, draft_vocabulary, full_distributions,
                                         sample_target, target_to_draft)
from specrl.validation import check_fields, within


@dataclass
class TrainHeadConfig:
    """Settings of `specrl train-draft --kind eagle3|mtp`; the defaults fit ~10 minutes on 2 cores.

    kind: eagle3 or mtp.
    draft_vocab: EAGLE-3's output vocabulary N (0 = the target's whole vocabulary); MTP always uses the target's head.
    depth: chain elements trained per anchor (training-time test); the K it drafts best.
    depth_decay: loss weight of depth j is depth_decay^(j-1).
    steps: optimiser steps (shuffled passes over the rollouts).
    train_seconds: training stops after this many seconds, even if steps remain.
    lr: peak AdamW learning rate (warm-up over 10 steps, cosine to lr / 10).
    micro_batch: sequences per optimiser step.
    loss: "ce", soft cross-entropy against the target's top-k p; "ce+tv", that plus the rejection
        probability TV(p, q) = 1 - sum min(p, q) (acceptance is 1 - TV), weighted per step so that both
        terms weigh alike (lambda = CE / TV, detached): the cross-entropy pulls q's whole shape towards p,
        the TV term the mass acceptance counts.
    init: a saved head of this kind to start from (its vocabulary kept), else a fresh one from the target.
    seed: seeds prompts, sampling and data order.
    threads: torch CPU threads.
    data: how the target's rollouts are sampled.
    """

    kind: Literal[tuple(HEAD_KINDS)] = "eagle3"  # type: ignore[valid-type]
    draft_vocab: int = within(8192, "[0, inf)")
    depth: int = within(3, "[1, inf)")
    depth_decay: float = within(0.8, "(0, 1]")
    steps: int = within(400, "[1, inf)")
    train_seconds: float = within(240.0, "(0, inf)")
    lr: float = within(1e-3, "(0, inf)")
    micro_batch: int = within(8, "[1, inf)")
    loss: Literal["ce", "ce+tv"] = "ce"
    init: str | None = None
    seed: int = 0
    threads: int = within(1, "[1, inf)")
    data: RolloutDataConfig = field(default_factory=RolloutDataConfig)

    def __post_init__(self) -> None:
        check_fields(self)


def _batch(rollouts: Rollouts, idx: list[int], layers: tuple[int, ...]):
    """Right-padded ids [B, S], pad mask [B, S], features {layer: [B, S, H]} (zeros at the last
    position and in padding), and the loss map: r_index [B, S] = the row of p that row i of the
    chain predicts (i + 2 - L), -1 where none."""
    S = max(len(rollouts.ids[i]) for i in idx)
    B = len(idx)
    ids = torch.zeros(B, S, dtype=torch.long)
    pad = torch.zeros(B, S, dtype=torch.bool)
    feats = {layer: torch.zeros(B, S, rollouts.features[idx[0]][layer].shape[-1]) for layer in layers}
    r_index = torch.full((B, S), -1, dtype=torch.long)
    for b, i in enumerate(idx):
        n, L, R = len(rollouts.ids[i]), rollouts.prompt_lens[i], len(rollouts.top_p[i])
        ids[b, :n], pad[b, :n] = rollouts.ids[i], True
        for layer in layers:
            feats[layer][b, :n - 1] = rollouts.features[i][layer].float()
        rows = torch.arange(max(L - 2, 0), min(L - 2 + R, S))
        r_index[b, rows] = rows + 2 - L
    return ids, pad, feats, r_index


def _chain_terms(head: DraftHead, rollouts: Rollouts, idx: list[int], config: TrainHeadConfig,
                 t2d: torch.Tensor | None, full_p: list[torch.Tensor] | None = None):
    """Per depth: (log q [P, V_out], p on the support [P, V_out], p's full-vocab top id [P]) at the
    positions that count (anchor e = i - j + 1 >= L - 2 and a response token to predict)."""
    ids, pad, feats, r_index = _batch(rollouts, idx, head.hidden_layers)
    L = torch.tensor([rollouts.prompt_lens[i] for i in idx]).unsqueeze(1)  # [B, 1]
    g_per_depth = head.forward_train(feats, ids, pad, config.depth, first_anchor=max(int(L.min()) - 2, 0))
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    terms = []
    for j, g in enumerate(g_per_depth):
        valid = (r_index >= 0) & (positions - j >= L - 2)  # [B, S]
        b_idx, i_idx = valid.nonzero(as_tuple=True)
        r = r_index[b_idx, i_idx]
        logq = torch.log_softmax(head.logits(g[b_idx, i_idx]).float(), dim=-1)  # [P, V_out]
        if not len(r):  # no response reaches this depth (a micro-batch of the shortest responses)
            terms.append((logq, torch.zeros_like(logq), torch.zeros(0, dtype=torch.long)))
            continue
        if full_p is not None:  # held-out: p in full, exact
            p_full = torch.stack([full_p[idx[b]][rr] for b, rr in zip(b_idx.tolist(), r.tolist())]).float()
            p = p_full if head.d2t is None else p_full[:, head.d2t]
            top = p_full.argmax(-1)
        else:
            top_ids = torch.stack([rollouts.top_ids[idx[b]][rr] for b, rr in zip(b_idx.tolist(), r.tolist())]).long()
            top_p = torch.stack([rollouts.top_p[idx[b]][rr] for b, rr in zip(b_idx.tolist(), r.tolist())]).float()
            cols = top_ids if t2d is None else t2d[top_ids]
            p = torch.zeros_like(logq).scatter_add_(-1, cols.clamp_min(0), top_p * (cols >= 0))
            top = top_ids[:, 0]
        terms.append((logq, p, top))
    return terms


@torch.no_grad()
def evaluate(head: DraftHead, held: Rollouts, full_p: list[torch.Tensor], config: TrainHeadConfig) -> dict:
    """Exact held-out means per depth: loss (p renormalised on the support), acceptance sum_x min(p, q),
    top-1 agreement with argmax p; and tau_est = 1 + a1 + a1 a2 + ... (acceptance length if depths
    were independent)."""
    head.eval()
    sums = [{"loss": 0.0, "acceptance": 0.0, "top1": 0.0, "n": 0} for _ in range(config.depth)]
    for s in range(0, len(held.ids), config.micro_batch):
        idx = list(range(s, min(s + config.micro_batch, len(held.ids))))
        for j, (logq, p, top) in enumerate(_chain_terms(head, held, idx, config, None, full_p)):
            q = logq.exp()
            sums[j]["loss"] += float(soft_cross_entropy(logq, p).sum())
            sums[j]["acceptance"] += float(torch.minimum(p, q).sum())
            q_top = logq.argmax(-1) if head.d2t is None else head.d2t[logq.argmax(-1)]
            sums[j]["top1"] += float((q_top == top).sum())
            sums[j]["n"] += p.shape[0]
    per_depth = [{k: round(v[k] / max(v["n"], 1), 4) for k in ("loss", "acceptance", "top1")} for v in sums]
    tau, prefix = 1.0, 1.0
    for d in per_depth:
        prefix *= d["acceptance"]
        tau += prefix
    return {"per_depth": per_depth, "tau_est": round(tau, 3)}


def train(head: DraftHead, rollouts: Rollouts, t2d: torch.Tensor | None, config: TrainHeadConfig,
          saving: Saving | None = None) -> FitResult:
    """Soft cross-entropy over chain depths (resumed from and saved to `saving`, when given)."""
    weights = [config.depth_decay ** j for j in range(config.depth)]

    def depth_loss(logq: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        ce = soft_cross_entropy(logq, p).mean()
        if config.loss == "ce":
            return ce
        tv = rejection(logq, p).mean()
        return ce + (ce.detach() / tv.detach().clamp_min(1e-6)) * tv

    def loss_of(idx: list[int]) -> torch.Tensor:
        terms = [(w, logq, p) for w, (logq, p, _) in zip(weights, _chain_terms(head, rollouts, idx, config, t2d))
                 if len(p)]  # depth 1 always has rows
        return sum(w * depth_loss(logq, p) for w, logq, p in terms) / sum(w for w, _, _ in terms)

    head.train()
    batch_at = indexed(shuffled_batches(len(rollouts.ids), config.micro_batch, config.seed + 7,
                                        lengths=[len(ids) for ids in rollouts.ids]))
    result = fit([p for p in head.parameters() if p.requires_grad], lambda step: loss_of(batch_at(step)),
                 config.steps, config.lr, 10, f"train {head.kind}", seconds=config.train_seconds, saving=saving)
    head.eval()
    return result


def new_head(kind: str, target: LlamaModel, soft_counts: torch.Tensor, draft_vocab: int) -> DraftHead:
    """A fresh head of `kind`, over the `draft_vocab` most sampled ids where its class drafts a reduced
    vocabulary and 0 < draft_vocab < V (else the whole vocabulary)."""
    head = HEAD_KINDS[kind]
    if head.reduced_vocabulary and 0 < draft_vocab < target.cfg.vocab_size:
        return head.from_target(target, d2t=draft_vocabulary(soft_counts, draft_vocab)[0])
    return head.from_target(target)


def train_head(target_name: str, target_dir, out, config: TrainHeadConfig, rollouts_dir: Path | None = None,
               command: str = "", work: Work | None = None) -> dict:
    """Sample (or load) the target's rollouts, build and train the head, evaluate it held-out, save it to
    `out` (weights in fp16: a draft's precision never touches exactness). With `work`, the rollouts and the
    training state are kept in its folder and resumed from it; a sitting that ends before the budget
    returns {"finished": False, ...} and saves no head."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    t0 = time.perf_counter()
    try:
        torch.manual_seed(config.seed)
        samples = sample_target(target_name, target_dir, config.data, config.seed,
                                rollouts_dir or (work.rollouts if work else None))
        head = load_head(config.init, samples.target, config.kind) if config.init else \
            new_head(config.kind, samples.target, samples.soft_counts, config.draft_vocab)
        t2d = None if head.d2t is None else target_to_draft(head.d2t, samples.target.cfg.vocab_size)
        full_p = full_distributions(samples.target, samples.held)
        before = evaluate(head, samples.held, full_p, config)
        result = train(head, samples.train, t2d, config, work.saving(head) if work else None)
        if not result.finished:
            return work.unfinished(result)
        after = evaluate(head, samples.held, full_p, config)
    finally:
        torch.set_num_threads(threads)
    summary = {
        "target": str(target_dir), "kind": config.kind, "draft_vocab": head.output_vocab_size,
        "train_rollouts": len(samples.train), "train_tokens": samples.train.tokens,
        "held_out_tokens": samples.held.tokens, "before": before, "after": after,
        "train_loss_final": round(result.loss, 4), "train_steps": result.steps,
        "sample_seconds": round(samples.sample_seconds, 1), "seconds": round(time.perf_counter() - t0, 1),
    }
    record = {"command": command, "config": asdict(config), "summary": summary}
    started_from = Path(config.init or "") / "specrl_train.json"
    if config.init and started_from.is_file():  # the head it continued: how that one was trained, in turn
        record["init_record"] = json.loads(started_from.read_text())
    save_atomically(out, lambda tmp: (head.save(tmp, dtype=torch.float16), samples.tokenizer.save_pretrained(tmp)),
                    record)
    return {**summary, "finished": True, "out": str(out)}
