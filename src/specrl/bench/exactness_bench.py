"""Exactness over whole responses, one sample at a time: is each speculative variant's output the target's?

Comparing two samplers' mean logprobs (`bench rollout`'s `logprob_z`) mixes the sampling noise of both
sides with the spread between prompts and lengths, and reads a gap of 0.1 nats per token as a trend
where there is none. This bench tests each variant on its own against the exact distribution instead.

For each of `samples` prompts and each variant (no speculation, the planner, a fixed K-chain,
a fixed width-3 tree), one call of one row at temperature 1 with its own seed; then a clean forward of
prompt + response in `transformers` gives, at every response position t, the exact conditional p_t and

    d_t = log p_t(x_t) + H(p_t),   Var_t = Var_{x ~ p_t}[log p_t(x)],

which has mean 0 given everything before it when x_t ~ p_t (a martingale difference, so a response that
stops at EOS or max_tokens changes nothing). z = sum d_t / sqrt(sum Var_t) is then N(0, 1) for an exact
sampler, and a sampler biased towards less likely tokens (lower logprob) shows as z < 0 with a known null
variance, no second sample needed. The same z per response position (1..6, the 6th pooling the rest) says
where a bias would sit. `exact_terms` is shared with the SmolLM2 exactness test. Ends with one JSON line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from rich.table import Table

from specrl.backends import BackendConfig, make_backend
from specrl.bench import Bench
from specrl.models.checkpoint import load_causal_lm
from specrl.models.registry import resolve_checkpoint
from specrl.sampling import SamplingParams, sampling_logprobs
from specrl.speculation.proposer_registry import KINDS, PROPOSER_NAMES
from specrl.tasks.presets import preset_prompts
from specrl.validation import check_fields, within

POSITIONS = 6  # z per response position 1..6, the last pooling every later one


@dataclass(frozen=True)
class ExactnessBenchConfig:
    SECTION: ClassVar[str] = "bench exactness"

    model: str = "smollm2-135m"  # tiny | smollm2-135m | a checkpoint directory
    proposer: Literal[PROPOSER_NAMES] = "eagle3"  # type: ignore[valid-type]  # the speculative variants' proposer
    samples: int = within(150, "[2, inf)")  # prompts, one call of one row each per variant
    max_tokens: int = within(40, "[1, inf)")  # response cap
    k: int = within(3, "[1, inf)", alias="K")  # the fixed chain's and tree's depth
    temperature: float = within(1.0, "(0, inf)")
    seed: int = 10000  # call i runs with seed + i in every variant
    threads: int | None = within(None, "[1, inf)")  # torch CPU threads; None = all cores

    def __post_init__(self):
        check_fields(self)


def exact_terms(reference, prompt: list[int], responses: list[list[int]],
                params: SamplingParams) -> tuple[torch.Tensor, ...]:
    """Per sampled token of responses of equal length, under the exact conditional p (a clean `transformers`
    forward of prompt + response, `params`' truncation): (F(x - 1), p(x), d = log p(x) + H(p),
    Var_p[log p], log p(x)), each [N, T] float64; F is p's CDF in token-id order."""
    ids = torch.tensor([prompt + r for r in responses])
    with torch.no_grad():
        logits = reference(input_ids=ids).logits.float()[:, len(prompt) - 1:-1]  # [N, T, V]
    logp = sampling_logprobs(logits.double(), params)
    p = logp.exp()
    x = torch.tensor(responses).unsqueeze(-1)
    below = (p.cumsum(-1) - p).gather(-1, x).squeeze(-1)
    own_logp = logp.gather(-1, x).squeeze(-1)
    entropy = -torch.where(p > 0, p * logp, 0.0).sum(-1)
    second = torch.where(p > 0, p * logp * logp, 0.0).sum(-1)
    return below, own_logp.exp(), own_logp + entropy, second - entropy ** 2, own_logp


def _variants(config: ExactnessBenchConfig) -> dict[str, BackendConfig]:
    """No speculation, the planner, a fixed chain and (for the hidden-state heads, the proposers
    that draft trees) a fixed width-3 tree."""
    common = dict(model=config.model, proposer=config.proposer)
    fixed = dict(common, adaptive=False, num_speculative_tokens=config.k)
    variants = {"none": BackendConfig(model=config.model, proposer="none"), "adaptive": BackendConfig(**common),
                f"chain k={config.k}": BackendConfig(**fixed)}
    if KINDS[config.proposer].drafts_trees:
        variants[f"tree k={config.k} w=3"] = BackendConfig(**fixed, fixed_tree_width=3)
    return variants


def run_exactness_bench(config: ExactnessBenchConfig, progress=None) -> dict:
    variants = _variants(config)
    backends = {name: make_backend(c) for name, c in variants.items()}
    tokenizer = backends["none"].tokenizer
    prompts = preset_prompts(config.model, tokenizer, config.samples, seed=0)
    samples: dict[str, list[list[int]]] = {name: [] for name in backends}  # per variant, a response per prompt
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=config.temperature, max_tokens=config.max_tokens, seed=config.seed + i)
        for name, backend in backends.items():
            samples[name].append(backend.generate([prompt], params).completions[0].token_ids)
        if progress is not None:
            progress(i + 1, 2 * config.samples)
    reference = load_causal_lm(resolve_checkpoint(config.model)).eval()
    params = SamplingParams(temperature=config.temperature)
    sums = {name: torch.zeros(2, POSITIONS, dtype=torch.float64) for name in backends}  # (sum d, sum Var) per position
    tokens = {name: 0 for name in backends}
    for i, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        for name in backends:
            response = samples[name][i]
            _, _, d, var, _ = exact_terms(reference, ids, [response], params)
            position = torch.arange(len(response)).clamp_max(POSITIONS - 1)
            sums[name][0].index_add_(0, position, d[0])
            sums[name][1].index_add_(0, position, var[0])
            tokens[name] += len(response)
        if progress is not None:
            progress(config.samples + i + 1, 2 * config.samples)
    variants_out = {}
    for name, s in sums.items():
        variants_out[name] = {"z": float(s[0].sum() / s[1].sum().sqrt()), "tokens": tokens[name],
                              "z_per_position": [round(float(a / b.sqrt()), 2) if b > 0 else None for a, b in s.T]}
    return {"model": config.model, "proposer": config.proposer, "samples": config.samples,
            "max_tokens": config.max_tokens, "temperature": config.temperature, "threads": torch.get_num_threads(),
            "variants": variants_out, "max_abs_z": max(abs(v["z"]) for v in variants_out.values())}


def report(summary: dict, config: ExactnessBenchConfig, console) -> None:
    """Each variant's z over all its tokens and per response position."""
    table = Table(title=f"exactness: {config.model}, {config.proposer}, T={config.temperature}, "
                        f"{config.samples} responses per variant")
    for column in ("variant", "tokens", "z (N(0, 1) if exact)", "z per position 1..6"):
        table.add_column(column)
    for name, row in summary["variants"].items():
        table.add_row(name, str(row["tokens"]), f"{row['z']:+.2f}", str(row["z_per_position"]))
    console.print(table)


BENCH = Bench(ExactnessBenchConfig, run_exactness_bench, report, steps=lambda c: 2 * c.samples,
              help="each speculative variant's whole responses against the exact distribution (one-sample z per "
                   "variant, no second sample needed)",
              description="For --samples prompts, samples one response per variant (no speculation, the planner, a "
                          "fixed K-chain and, for heads, a width-3 tree), one row per call with its own seed, then "
                          "scores every token against the exact conditional from a clean transformers forward: z = "
                          "sum(log p(x) + H(p)) / sqrt(sum Var[log p]) is N(0, 1) for an exact sampler (also per "
                          "response position).")
