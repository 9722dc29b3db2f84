"""How often the int8 self-draft's token would be accepted: sum_x min(p, q) on the policy's own responses.

    specrl bench self-draft-acceptance [--model smollm2-135m] [--samples 16] [--max-tokens 96]
                                       [--kernels vnni,avx512]

Samples one temperature-1 response per prompt (the model's preset prompts) from the fp32 policy on the
embedded engine, then teacher-forces prompt + response through the policy (p) and through its int8 copy
(`LlamaModel.int8_copy`, q, the self-draft as the engine runs it, on each int8 kernel asked for: `vnni`
rounds the activations to int8 too, the others keep them fp32) and averages, over the response
positions, sum_x min(p, q): the probability that one token drafted from q is accepted. It repeats this
for the policy drifted by 2% and 5% of each weight row's RMS (Gaussian, seeded), because SmolLM2 here is
dequantized from a 4-bit GGUF: its weights sit on a grid that int8 rounding might fit by luck, and RL
moves them off it. Ends with one JSON line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from rich.table import Table

from specrl.bench import Bench
from specrl.backends import BackendConfig, make_backend
from specrl.models.checkpoint import load_state_dict
from specrl.models.llama import int8_kernels
from specrl.models.registry import resolve_checkpoint
from specrl.sampling import SamplingParams
from specrl.tasks.presets import preset_prompts
from specrl.validation import check_fields, within

DRIFTS = (0.0, 0.02, 0.05)


def drifted(state: dict[str, torch.Tensor], relative: float, seed: int = 1) -> dict[str, torch.Tensor]:
    """Every matrix plus Gaussian noise of `relative` times its row's RMS."""
    generator = torch.Generator().manual_seed(seed)
    return {name: w + torch.randn(w.shape, generator=generator) * w.pow(2).mean(-1, keepdim=True).sqrt() * relative
            if w.dim() == 2 else w for name, w in state.items()}


@torch.inference_mode()
def acceptance(model, sequences: list[tuple[list[int], list[int]]], kernel: str | None = None) -> torch.Tensor:
    """sum_x min(p, q) at every response position of every (prompt, response), q from `model.int8_copy(kernel)`."""
    draft = model.int8_copy(kernel)
    out = []
    for prompt, response in sequences:
        ids = torch.tensor([prompt + response])
        p, _ = model.forward(ids, model.new_cache(1, ids.shape[1]))
        q, _ = draft.forward(ids, draft.new_cache(1, ids.shape[1]))
        rows = slice(len(prompt) - 1, ids.shape[1] - 1)
        out.append(torch.minimum(p[0, rows].double().softmax(-1), q[0, rows].double().softmax(-1)).sum(-1))
    return torch.cat(out)


@dataclass(frozen=True)
class SelfDraftAcceptanceBenchConfig:
    """Whose self-draft, on how many responses, with which int8 kernels."""

    SECTION: ClassVar[str] = "bench self-draft-acceptance"

    model: str = "smollm2-135m"  # a registered model or a checkpoint folder
    samples: int = within(16, "[1, inf)")  # prompts, one temperature-1 response each
    max_tokens: int = within(96, "[1, inf)")  # response cap
    # the int8 kernels to measure (each must run on this CPU, or `eager`); empty = the one the self-draft uses
    kernels: tuple[str, ...] = ()
    threads: int | None = within(2, "[1, inf)")  # torch CPU threads

    def __post_init__(self):
        check_fields(self)
        runnable = int8_kernels() + ("eager",)
        unknown = [k for k in self.kernels if k not in runnable]
        if unknown:  # before the responses are sampled, not after
            raise ValueError(f"bench self-draft-acceptance: kernels {unknown} cannot run here; this CPU runs "
                             f"{list(runnable)}")


def run_self_draft_acceptance_bench(config: SelfDraftAcceptanceBenchConfig, progress=None) -> dict:
    """Mean and 10th percentile of sum_x min(p, q) per kernel and drift."""
    kernels = list(config.kernels) or [None]
    backend = make_backend(BackendConfig(model=config.model))
    tokenizer, model = backend.tokenizer, backend.engine.model
    prompts = preset_prompts(config.model, tokenizer, config.samples, seed=0)
    result = backend.generate(prompts, SamplingParams(temperature=1.0, max_tokens=config.max_tokens, seed=1))
    sequences = [(tokenizer.encode(p, add_special_tokens=False), c.token_ids) for p, c in zip(prompts, result.completions)]
    state = load_state_dict(resolve_checkpoint(config.model))
    rows: dict[str, dict] = {}
    for i, drift in enumerate(DRIFTS):
        model.load_weights(drifted(state, drift) if drift else state)
        for kernel in kernels:
            a = acceptance(model, sequences, kernel)
            rows.setdefault(kernel or "default", {})[f"drift {drift:g}"] = {"mean": round(float(a.mean()), 4),
                                                                           "p10": round(float(a.quantile(0.1)), 4)}
        if progress is not None:
            progress(i + 1)
    return {"bench": "self_draft_acceptance", "model": config.model, "threads": torch.get_num_threads(),
            "response_tokens": sum(len(r) for _, r in sequences), "acceptance": rows}


def report(summary: dict, config: SelfDraftAcceptanceBenchConfig, console) -> None:
    table = Table(title=f"int8 self-draft of {config.model}: sum_x min(p, q) over {summary['response_tokens']} "
                        "response tokens (mean / 10th percentile)")
    table.add_column("kernel")
    for drift in DRIFTS:
        table.add_column(f"policy drifted {drift:.0%}")
    for kernel, by_drift in summary["acceptance"].items():
        table.add_row(kernel, *(f"{v['mean']:.4f} / {v['p10']:.4f}" for v in by_drift.values()))
    console.print(table)


BENCH = Bench(SelfDraftAcceptanceBenchConfig, run_self_draft_acceptance_bench, report, steps=lambda c: len(DRIFTS),
              help="how often the int8 self-draft's token would be accepted, on the policy's own responses",
              description=__doc__.split("\n\n", 1)[1].split("Ends with")[0].strip())
