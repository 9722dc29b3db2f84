"""`specrl pretrain`: train `tiny` on arithmetic from a fixed seed, then distil `tiny-draft` from it.

Recipe (all from `PretrainConfig.seed`, on `threads` CPU threads, so a rerun on the
same machine reproduces the committed checkpoints):
1. tiny: next-token cross-entropy on the response tokens ("12+34=46</s>") of
   training-split problems, AdamW with linear warm-up and cosine decay.
2. tiny-draft: soft cross-entropy against tiny's temperature-1 distribution on tiny's
   own temperature-1 samples of training prompts, the text a draft sees in rollouts.
3. Evaluation on the held-out split: tiny's greedy and sampled accuracy, and the
   draft's top-1 agreement and expected acceptance sum_x min(p, q) on tiny's samples.

Each model is written to a temporary folder and renamed into `out/tiny` and
`out/tiny-draft`, so an interrupted run never leaves a half-written checkpoint.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedModel

from specrl.models.char_tokenizer import build_char_tokenizer, save_char_tokenizer
from specrl.models.checkpoint import save_atomically
from specrl.models.tiny import EOS_ID, PAD_ID, TINY, TINY_DRAFT, TinyShape
from specrl.rl.sequences import masked_mean, sample_responses, train_batch
from specrl.speculation.draft_losses import add_totals, agreement, distill_loss, mean_agreement
from specrl.tasks import arithmetic
from specrl.training.loop import fit
from specrl.validation import check_fields, within


@dataclass
class PretrainConfig:
    """Settings of `specrl pretrain`; the defaults reproduce the committed checkpoints.

    steps: optimiser steps for tiny.
    draft_steps: optimiser steps for tiny-draft.
    batch_size: sequences per step (both models).
    lr: peak AdamW learning rate (both models); warm-up then cosine decay to lr / 10.
    warmup: linear warm-up steps.
    distill_samples: tiny's own samples the draft is distilled on (drawn once, reused).
    eval_problems: held-out problems for the final evaluation.
    seed: seeds weights, data order and sampling.
    threads: torch CPU threads; 1 keeps runs bit-reproducible and leaves cores free.
    task: which arithmetic problems.
    """

    steps: int = within(220, "[1, inf)")
    draft_steps: int = within(400, "[1, inf)")
    batch_size: int = within(64, "[1, inf)")
    lr: float = within(3e-3, "(0, inf)")
    warmup: int = within(50, "[0, inf)")
    distill_samples: int = within(4096, "[1, inf)")
    eval_problems: int = within(500, "[1, inf)")
    seed: int = 0
    threads: int = within(1, "[1, inf)")
    task: arithmetic.ArithmeticConfig = field(default_factory=arithmetic.ArithmeticConfig)

    def __post_init__(self) -> None:
        check_fields(self)


def _encode(texts: list[str]) -> list[list[int]]:
    tok = build_char_tokenizer(arithmetic.ALPHABET)
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def _max_new_tokens(task: arithmetic.ArithmeticConfig) -> int:
    # "a op b = answer" plus eos; a product has at most 2 * digits digits, a difference a sign.
    return 3 * task.digits + 2 + 1 + 1


def _optimise(model: PreTrainedModel, steps: int, config: PretrainConfig, loss_fn, desc: str) -> float:
    """`steps` steps of the shared loop on `loss_fn(step)`; returns the mean loss of the last 50 steps."""
    model.train()
    result = fit(list(model.parameters()), loss_fn, steps, config.lr, config.warmup, desc, weight_decay=0.01,
                 window=50)
    model.eval()
    return result.loss


def _new_model(shape: TinyShape, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(shape.llama_config()).float()


def train_tiny(config: PretrainConfig) -> tuple[LlamaForCausalLM, float]:
    """Train the target on reference responses; returns the model and its final loss."""
    model = _new_model(TINY, config.seed)
    problems = arithmetic.generate_problems(config.task, config.steps * config.batch_size, config.seed, "train")
    eos = [EOS_ID]

    def loss_fn(step: int) -> torch.Tensor:
        chunk = problems[step * config.batch_size : (step + 1) * config.batch_size]
        batch = train_batch(_encode([p.prompt for p in chunk]), [r + eos for r in _encode([p.response for p in chunk])], PAD_ID)
        logits = model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits[:, :-1]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.ids[:, 1:], reduction="none")
        return masked_mean(ce, batch.loss_mask[:, :-1])

    return model, _optimise(model, config.steps, config, loss_fn, "pretrain tiny")


def _teacher_samples(target: PreTrainedModel, problems: list[arithmetic.Problem], config: PretrainConfig, seed: int):
    prompts = _encode([p.prompt for p in problems])
    responses: list[list[int]] = []
    for start in range(0, len(prompts), 512):
        responses += sample_responses(
            target, prompts[start : start + 512], max_new_tokens=_max_new_tokens(config.task),
            eos_id=EOS_ID, pad_id=PAD_ID, temperature=1.0, seed=seed + start,
        )
    return prompts, responses


def distil_tiny_draft(target: PreTrainedModel, config: PretrainConfig) -> tuple[LlamaForCausalLM, float]:
    """Distil the draft from the target's temperature-1 samples; returns the draft and its final loss."""
    problems = arithmetic.generate_problems(config.task, config.distill_samples, config.seed + 1, "train")
    prompts, responses = _teacher_samples(target, problems, config, config.seed + 2)
    draft = _new_model(TINY_DRAFT, config.seed + 3)
    order = torch.Generator().manual_seed(config.seed + 4)

    def loss_fn(step: int) -> torch.Tensor:
        idx = torch.randint(len(prompts), (config.batch_size,), generator=order).tolist()
        batch = train_batch([prompts[i] for i in idx], [responses[i] for i in idx], PAD_ID)
        with torch.no_grad():
            p_logits = target(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
        q_logits = draft(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
        return distill_loss(p_logits, q_logits, batch.loss_mask)

    return draft, _optimise(draft, config.draft_steps, config, loss_fn, "distil tiny-draft")


@torch.no_grad()
def evaluate(target: PreTrainedModel, draft: PreTrainedModel | None, config: PretrainConfig) -> dict[str, float]:
    """Held-out accuracy of the target (greedy and temperature 1) and, given a draft, its agreement."""
    tok = build_char_tokenizer(arithmetic.ALPHABET)
    out: dict[str, float] = {}
    seen = arithmetic.generate_problems(config.task, config.eval_problems, config.seed + 99, "train")
    problems = arithmetic.generate_problems(config.task, config.eval_problems, config.seed + 100, "test")
    prompts = _encode([p.prompt for p in problems])
    for name, split_problems, temperature in (
        ("accuracy_train_greedy", seen, 0.0),  # memorisation check: close to held-out means it generalises
        ("accuracy_greedy", problems, 0.0),
        ("accuracy_sampled", problems, 1.0),  # last, so `responses` below are temperature-1 samples
    ):
        split_prompts = _encode([p.prompt for p in split_problems])
        responses = sample_responses(
            target, split_prompts, max_new_tokens=_max_new_tokens(config.task),
            eos_id=EOS_ID, pad_id=PAD_ID, temperature=temperature, seed=config.seed + 101,
        )
        texts = [tok.decode(r, skip_special_tokens=True) for r in responses]
        out[name] = sum(arithmetic.score(p, t) for p, t in zip(split_problems, texts)) / len(split_problems)
    if draft is not None:
        batch = train_batch(prompts, responses, PAD_ID)  # the target's own temperature-1 samples
        p_logits = target(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
        q_logits = draft(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
        stats = mean_agreement(agreement(p_logits, q_logits, batch.loss_mask))
        out.update({f"draft_{k}": v for k, v in stats.items()})
    return out


def save_checkpoint(model: PreTrainedModel, out_dir: Path, max_length: int, extra: dict) -> None:
    """Write model (safetensors + config.json), tokenizer and a training summary, atomically."""
    save_atomically(Path(out_dir), lambda tmp: (model.save_pretrained(tmp),
                                                save_char_tokenizer(arithmetic.ALPHABET, tmp, max_length)), extra)


def pretrain(config: PretrainConfig, out: Path) -> dict:
    """Train tiny and tiny-draft, save both under `out`, and return the summary."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        start = time.perf_counter()
        target, loss = train_tiny(config)
        draft, draft_loss = distil_tiny_draft(target, config)
        metrics = evaluate(target, draft, config)
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    summary = {"loss": loss, "draft_loss": draft_loss, **metrics, "seconds": round(seconds, 1)}
    recipe = {"config": asdict(config), "summary": summary}
    save_checkpoint(target, Path(out) / "tiny", TINY.max_positions, recipe)
    save_checkpoint(draft, Path(out) / "tiny-draft", TINY_DRAFT.max_positions, recipe)
    return {**summary, "out": str(Path(out).resolve())}
