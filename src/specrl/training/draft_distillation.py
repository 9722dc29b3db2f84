"""`specrl train-draft`: distil a reduced-vocabulary draft for SmolLM2-135M on its own samples.

What it does, in order (every step seeded, CPU threads set on purpose):
1. Prompts: the target's RL preset task, rendered exactly as RL renders it
   (`pipeline.config.preset_prompts`): the text RL rollouts produce.
2. Samples: the target answers them with `generate` (plain sampling, temperature 1),
   batch by batch until `sample_seconds` runs out. `generate` also hands back the logits
   it sampled from, so the target's next-token distribution p at every response position
   costs no extra forward pass. One held-out batch (other seeds) comes first.
3. Draft vocabulary: the N target ids with the largest expected count sum_t p_t(x) over
   the training positions (soft counts: they cover the most probability mass, unlike raw
   counts of the few thousand sampled tokens). `d2t` maps draft ids to them.
4. Distillation: the draft (see `reduced_vocab`: target embeddings + first `layers`
   layers + final norm + the N lm_head rows) is trained with soft cross-entropy
   -sum_x p~(x) log q(x), p~ = p restricted to the draft's support and renormalised.
   For memory, training positions keep p's top `top_k` entries (their mass is reported);
   held-out positions keep p in full, so the held-out metrics are exact.
   The input embedding stays frozen; layers, norm and head train (AdamW, cosine).
5. Held-out metrics before and after: the loss above, top-1 agreement, and the expected
   acceptance of one drafted token sum_x min(p(x), q(x)).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from specrl.models.checkpoint import load_causal_lm, load_tokenizer, save_atomically
from specrl.training.loop import fit, shuffled_batches
from specrl.training.losses import soft_cross_entropy
from specrl.models.reduced_vocab import build_draft, save_draft
from specrl.pipeline.config import preset_prompts
from specrl.rl.sequences import left_pad, train_batch
from specrl.validation import check_fields, within

@dataclass
class TrainDraftConfig:
    """Settings of `specrl train-draft`; the defaults fit in ~10 minutes on 2 CPU cores.

    layers: decoder layers of the draft (initialised from the target's first layers).
    draft_vocab: N, the size of the draft's output vocabulary.
    sample_batch: prompts per `generate` call.
    max_new_tokens: response cap when sampling.
    sample_seconds: sampling stops starting new batches after this many seconds.
    max_batches: at most this many training batches of samples.
    held_out_prompts: prompts in the held-out batch (sampled first, from other seeds).
    top_k: target probabilities kept per training position.
    steps: optimiser steps of distillation (cycling over the samples in shuffled passes).
    train_seconds: distillation stops after this many seconds, even if steps remain.
    lr: peak AdamW learning rate (linear warm-up over 10 steps, cosine to lr / 10).
    micro_batch: sequences per optimiser step.
    seed: seeds prompts, sampling and data order.
    threads: torch CPU threads; 1 by default: on 2 shared cores a second thread slowed sampling ~1.6x.
    """

    layers: int = within(2, "[1, inf)")
    draft_vocab: int = within(8192, "[1, inf)")
    sample_batch: int = within(64, "[1, inf)")
    max_new_tokens: int = within(96, "[1, inf)")
    sample_seconds: float = within(330.0, "(0, inf)")
    max_batches: int = within(12, "[1, inf)")
    held_out_prompts: int = within(12, "[1, inf)")
    top_k: int = within(128, "[1, inf)")
    steps: int = within(200, "[1, inf)")
    train_seconds: float = within(150.0, "(0, inf)")
    lr: float = within(1e-3, "(0, inf)")
    micro_batch: int = within(8, "[1, inf)")
    seed: int = 0
    threads: int = within(1, "[1, inf)")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class Samples:
    """The target's samples and its distributions at their response positions."""

    prompts: list[list[int]]
    responses: list[list[int]]  # each cut after eos (included) or at max_new_tokens
    top_p: list[torch.Tensor]  # per sample [len(response), top_k] float16, p's largest entries
    top_ids: list[torch.Tensor]  # per sample [len(response), top_k] int32
    full_p: list[torch.Tensor] | None  # per sample [len(response), V] float16, held-out only
    soft_counts: torch.Tensor  # [V] float64, sum over positions of p


@torch.no_grad()
def sample_with_distributions(target, prompts, config: TrainDraftConfig, seed: int, keep_full: bool) -> Samples:
    """One `generate` call; keeps, per response position, p's top-k (and, if asked, all of p)."""
    eos = target.config.eos_token_id
    ids, attention = left_pad(prompts, pad_id=eos)
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens, do_sample=True, temperature=1.0, top_k=None,
                           top_p=None, eos_token_id=eos, pad_token_id=eos,
                           return_dict_in_generate=True, output_logits=True)
    torch.manual_seed(seed)
    out = target.generate(input_ids=ids, attention_mask=attention, generation_config=gen)
    rows = out.sequences[:, ids.shape[1]:].tolist()
    lengths = [r.index(eos) + 1 if eos in r else len(r) for r in rows]
    vocab = out.logits[0].shape[-1]
    soft = torch.zeros(vocab, dtype=torch.float64)
    tops_p, tops_i, fulls = [[] for _ in rows], [[] for _ in rows], [[] for _ in rows]
    for t, logits in enumerate(out.logits):  # logits [B, V] predicting response token t
        live = torch.tensor([t < n for n in lengths])
        if not live.any():
            break
        p = torch.softmax(logits[live].float(), dim=-1)
        soft += p.sum(0, dtype=torch.float64)
        values, indices = p.topk(config.top_k, dim=-1)
        for j, b in enumerate(live.nonzero().flatten().tolist()):
            tops_p[b].append(values[j].half())
            tops_i[b].append(indices[j].int())
            if keep_full:
                fulls[b].append(p[j].half())
    return Samples(
        prompts=list(prompts),
        responses=[r[:n] for r, n in zip(rows, lengths)],
        top_p=[torch.stack(x) for x in tops_p],
        top_ids=[torch.stack(x) for x in tops_i],
        full_p=[torch.stack(x) for x in fulls] if keep_full else None,
        soft_counts=soft,
    )


def _merge(parts: list[Samples]) -> Samples:
    return Samples(
        prompts=[p for s in parts for p in s.prompts],
        responses=[r for s in parts for r in s.responses],
        top_p=[x for s in parts for x in s.top_p],
        top_ids=[x for s in parts for x in s.top_ids],
        full_p=None,
        soft_counts=sum(s.soft_counts for s in parts),
    )


def _flat_targets(samples: Samples, idx: list[int], d2t: torch.Tensor, t2d: torch.Tensor, full: bool) -> torch.Tensor:
    """p over the draft vocabulary at every response position of samples `idx`, flattened: [P, N].

    Rows are in the order of `train_batch(...).loss_mask.nonzero()` (sample by sample, step by
    step). Not renormalised: each row sums to p's mass on the draft's support (full=True reads
    the held-out full distributions, exactly; full=False the stored top-k entries).
    """
    rows = []
    for i in idx:
        if full:
            rows.append(samples.full_p[i][:, d2t].float())
        else:
            ids = t2d[samples.top_ids[i].long()]  # [steps, k], -1 outside the support
            vals = samples.top_p[i].float() * (ids >= 0)
            rows.append(torch.zeros(ids.shape[0], d2t.numel()).scatter_add_(-1, ids.clamp_min(0), vals))
    return torch.cat(rows)


def _draft_logq(draft, samples: Samples, idx: list[int]) -> torch.Tensor:
    """The draft's log q at the same flattened response positions: [P, N].

    The decoder runs over prompt + response, but the output head only over response
    positions (the prompt is given, never drafted), which saves most of the head's cost.
    """
    batch = train_batch([samples.prompts[i] for i in idx], [samples.responses[i] for i in idx], pad_id=0)
    hidden = draft.model(input_ids=batch.ids, attention_mask=batch.attention_mask).last_hidden_state
    return torch.log_softmax(draft.lm_head(hidden[batch.loss_mask.bool()]).float(), dim=-1)


def _metrics(draft, samples: Samples, d2t: torch.Tensor, t2d: torch.Tensor, micro_batch: int) -> dict[str, float]:
    """Exact held-out means: loss (p renormalised on the support), top-1 agreement with the
    target's argmax over the full vocabulary, acceptance sum_x min(p, q), and coverage (p's
    mass on the support, the ceiling of acceptance)."""
    tot = {"loss": 0.0, "top1": 0.0, "acceptance": 0.0, "coverage": 0.0}
    positions = 0
    draft.eval()
    with torch.no_grad():
        for s in range(0, len(samples.prompts), micro_batch):
            idx = list(range(s, min(s + micro_batch, len(samples.prompts))))
            p = _flat_targets(samples, idx, d2t, t2d, full=True)  # [P, N]
            logq = _draft_logq(draft, samples, idx)  # [P, N]
            mass = p.sum(-1)
            full_top = torch.cat([samples.full_p[i].float().argmax(-1) for i in idx])  # [P]
            tot["loss"] += float(-(p / mass.clamp_min(1e-12).unsqueeze(-1) * logq).sum())
            tot["acceptance"] += float(torch.minimum(p, logq.exp()).sum())
            tot["coverage"] += float(mass.sum())
            tot["top1"] += float((d2t[logq.argmax(-1)] == full_top).sum())
            positions += p.shape[0]
    return {k: v / max(positions, 1) for k, v in tot.items()}


def _distil(draft, samples: Samples, d2t: torch.Tensor, t2d: torch.Tensor, config: TrainDraftConfig) -> tuple[float, int]:
    """Soft cross-entropy training; returns (mean loss of the last 20 steps, steps taken)."""
    for p in draft.model.embed_tokens.parameters():
        p.requires_grad_(False)

    def loss_of(idx: list[int]) -> torch.Tensor:
        p = _flat_targets(samples, idx, d2t, t2d, full=False)
        return soft_cross_entropy(_draft_logq(draft, samples, idx), p).mean()

    draft.train()
    batches = shuffled_batches(len(samples.prompts), config.micro_batch, config.seed + 7)
    result = fit([p for p in draft.parameters() if p.requires_grad], lambda step: loss_of(next(batches)),
                 config.steps, config.lr, 10, "distil draft", seconds=config.train_seconds)
    draft.eval()
    return result


def _prompt_ids(target_name: str, tokenizer, count: int, seed: int) -> list[list[int]]:
    texts = preset_prompts(target_name, tokenizer, count, seed)
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def train_draft(target_name: str, target_path: Path, out: Path, config: TrainDraftConfig) -> dict:
    """Sample, choose the vocabulary, distil, evaluate, and save the draft to `out` (atomically)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    t0 = time.perf_counter()
    try:
        tokenizer = load_tokenizer(target_path)
        target = load_causal_lm(target_path).eval()
        held_prompts = _prompt_ids(target_name, tokenizer, config.held_out_prompts, config.seed + 1000)
        train_prompts = _prompt_ids(target_name, tokenizer, config.sample_batch * config.max_batches, config.seed)
        bar = tqdm(total=config.max_batches + 1, desc="sample target", unit="batch", dynamic_ncols=True)
        held = sample_with_distributions(target, held_prompts, config, config.seed + 1000, keep_full=True)
        bar.update(1)
        parts, sample_start = [], time.perf_counter()
        for b in range(config.max_batches):
            chunk = train_prompts[b * config.sample_batch : (b + 1) * config.sample_batch]
            parts.append(sample_with_distributions(target, chunk, config, config.seed + b, keep_full=False))
            bar.update(1)
            elapsed = time.perf_counter() - sample_start
            bar.set_postfix(tokens=sum(len(r) for s in parts for r in s.responses))
            if elapsed * (b + 2) / (b + 1) > config.sample_seconds:  # the next batch would overrun
                break
        bar.close()
        samples = _merge(parts)
        sampled_at = time.perf_counter()

        vocab = target.config.vocab_size
        n = min(config.draft_vocab, vocab)
        d2t = torch.sort(torch.topk(samples.soft_counts, n).indices).values  # [N], ascending target ids
        t2d = torch.full((vocab,), -1, dtype=torch.long)
        t2d[d2t] = torch.arange(n)

        draft = build_draft(target, config.layers, d2t)
        del target
        before = _metrics(draft, held, d2t, t2d, config.micro_batch)
        train_loss, train_steps = _distil(draft, samples, d2t, t2d, config)
        after = _metrics(draft, held, d2t, t2d, config.micro_batch)
    finally:
        torch.set_num_threads(threads)
    top_mass = float(sum(x.float().sum() for x in samples.top_p) / max(sum(len(r) for r in samples.responses), 1))
    summary = {
        "target": str(target_path),
        "layers": config.layers,
        "draft_vocab": n,
        "train_samples": len(samples.prompts),
        "train_tokens": sum(len(r) for r in samples.responses),
        "held_out_tokens": sum(len(r) for r in held.responses),
        "top_k_mass": round(top_mass, 4),
        "vocab_coverage_held_out": round(after["coverage"], 4),
        "loss_before": round(before["loss"], 4),
        "loss_after": round(after["loss"], 4),
        "top1_before": round(before["top1"], 4),
        "top1_after": round(after["top1"], 4),
        "acceptance_before": round(before["acceptance"], 4),
        "acceptance_after": round(after["acceptance"], 4),
        "train_loss_final": round(train_loss, 4),
        "train_steps": train_steps,
        "sample_seconds": round(sampled_at - t0, 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    save_atomically(Path(out), lambda tmp: (save_draft(draft, tmp), tokenizer.save_pretrained(tmp)),
                    {"config": asdict(config), "summary": summary})
    return {**summary, "out": str(Path(out).resolve())}
