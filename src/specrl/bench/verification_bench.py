"""Block vs token verification on the same draft chains: each rule's expected acceptance length.

Both rules are exact, so the rows a run visits follow the target whichever rule samples them. At every
verify step the bench takes the step's own drafts x, draft distributions q and target distributions p
and computes, in closed form, the number of drafts each rule accepts in expectation:

    token   E = sum_{m=1..K} prod_{i<m+1} a_i,                 a_i = min(1, p_i(x_i) / q_i(x_i))
    block   E = sum_{m=1..K} P(tau >= m) = sum_m [1 - prod_{l>=m} (1 - h_l)]   (h as in `block_verify`)

Acceptance length is 1 + E. Averaged over every chain the run verifies, the paired difference has far
less noise than two runs' realised acceptance lengths (the sampling of both the drafts and the accept
decisions cancels out of it). The run itself verifies with the engine's default rule (block) at a fixed
chain of K drafts; its realised acceptance length is reported beside the expectations as a check.
Ends with one JSON line.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import ClassVar

import torch
from rich.table import Table

from specrl.backends import BackendConfig, make_backend
from specrl.bench import Bench
from specrl.bench.rollout_bench import bench_inputs
from specrl.sampling import SamplingParams
from specrl.speculation.block_verify import block_rule
from specrl.speculation.proposer_registry import PROPOSER_NAMES
from specrl.speculation.verify import acceptance_probs
from specrl.telemetry.spec_stats import SpecStats
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class VerificationBenchConfig:
    SECTION: ClassVar[str] = "bench verification"

    model: str = "smollm2-135m"  # tiny | smollm2-135m | a checkpoint directory
    proposers: tuple[str, ...] = ("eagle3", "draft", "ngram", "int8")  # which proposers to run
    k: int = within(3, "[1, inf)", alias="K")  # drafts per chain, every step
    batch: int = within(4, "[1, inf)")  # rows per call (one prompt each)
    calls: int = within(8, "[1, inf)")  # calls per proposer, each on its own prompts
    max_tokens: int | None = within(128, "[1, inf)")  # response cap
    temperature: float = within(1.0, "(0, inf)")
    top_p: float = within(1.0, "(0, 1]")  # nucleus mass (1 = off)
    top_k: int = within(0, "[0, inf)")  # most likely ids kept (0 = off)
    seed: int = 0  # call i uses seed + i
    threads: int | None = within(None, "[1, inf)")  # torch CPU threads; None = all cores

    def __post_init__(self):
        check_fields(self)
        unknown = [p for p in self.proposers if p not in PROPOSER_NAMES]
        if unknown or not self.proposers:
            raise ValueError(f"proposers must be a non-empty subset of {PROPOSER_NAMES}, got {list(self.proposers)}")


def expected_accepted_token(drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor) -> torch.Tensor:
    """[B]: token verification's expected accepted drafts given the chain, sum_m prod_{i<=m} a_i."""
    return acceptance_probs(drafts, q, p).double().cumprod(dim=1).sum(dim=1)


def expected_accepted_block(drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor) -> torch.Tensor:
    """[B]: block verification's expected accepted drafts given the chain, sum_m [1 - prod_{l>=m} (1 - h_l)]."""
    h, _ = block_rule(drafts, q, p)
    none_from = (1 - h).flip(1).cumprod(dim=1).flip(1)  # [B, K]: P(no stop passes at l >= m)
    return (1 - none_from).sum(dim=1)


def run_verification_bench(config: VerificationBenchConfig, progress=None) -> dict:
    prompts, max_tokens = bench_inputs(config.model, config.calls * config.batch, config.seed, config.max_tokens,
                                       config.k)
    rows, done = [], 0
    for name in config.proposers:
        backend = make_backend(BackendConfig(model=config.model, proposer=name, num_speculative_tokens=config.k,
                                             adaptive=False, verification="block"))
        engine = backend.engine
        verifier, pairs = engine.verify_chain, []

        def recording(drafts, q, p, generator, verifier=verifier, pairs=pairs):
            if drafts.shape[1]:
                pairs.append(torch.stack([expected_accepted_token(drafts, q, p),
                                          expected_accepted_block(drafts, q, p)], dim=1))
            return verifier(drafts, q, p, generator)

        engine.verify_chain = recording
        realised = SpecStats()
        for c in range(config.calls):
            params = SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                                    max_tokens=max_tokens, seed=config.seed + c)
            result = backend.generate(prompts[c * config.batch:(c + 1) * config.batch], params)
            realised.merge(result.spec)
            done += 1
            if progress is not None:
                progress(done, len(config.proposers) * config.calls)
        both = torch.cat(pairs).double()  # [chains, 2]: (token, block)
        gain = both[:, 1] - both[:, 0]
        rows.append({
            "proposer": name, "chains": both.shape[0],
            "acceptance_length_token": 1 + float(both[:, 0].mean()),
            "acceptance_length_block": 1 + float(both[:, 1].mean()),
            "gain": float(gain.mean()), "gain_stderr": float(gain.std()) / math.sqrt(len(gain)),
            "realised_acceptance_length": realised.acceptance_length,
        })
        del backend, engine
    return {"model": config.model, "k": config.k, "batch": config.batch, "calls": config.calls,
            "max_tokens": max_tokens, "temperature": config.temperature, "top_p": config.top_p,
            "top_k": config.top_k, "rows": rows,
            "median_gain": statistics.median(row["gain"] for row in rows)}


def report(summary: dict, config: VerificationBenchConfig, console) -> None:
    """Per proposer: both rules' expected acceptance length on the same chains, the paired gain, the realised."""
    table = Table(title=f"block vs token verification: {config.model}, K={config.k}, batch {config.batch}, "
                        f"T={config.temperature}")
    for column in ("proposer", "chains", "accept len token", "accept len block", "gain (± s.e.)", "realised"):
        table.add_column(column)
    for row in summary["rows"]:
        table.add_row(row["proposer"], str(row["chains"]), f"{row['acceptance_length_token']:.3f}",
                      f"{row['acceptance_length_block']:.3f}", f"{row['gain']:+.3f} ± {row['gain_stderr']:.3f}",
                      f"{row['realised_acceptance_length']:.2f}")
    console.print(table)


BENCH = Bench(VerificationBenchConfig, run_verification_bench, report, steps=lambda c: len(c.proposers) * c.calls,
              help="block vs token verification: each rule's expected acceptance length on the same draft chains",
              description="Runs each proposer at a fixed chain of K drafts and, at every verify step, computes in "
                          "closed form how many drafts token-by-token and block verification accept in expectation "
                          "on that step's drafts, q and p. Reports both acceptance lengths, their paired difference "
                          "with its standard error, and the run's realised acceptance length.")
