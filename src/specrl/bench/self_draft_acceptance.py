"""How often the int8 self-draft's token would be accepted: sum_x min(p, q) on the policy's own responses.

    python -m specrl.bench.self_draft_acceptance [--model smollm2-135m] [--samples 16] [--max-tokens 96]
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

import argparse
import json

import torch

from specrl.backends import BackendConfig, make_backend
from specrl.models.checkpoint import load_state_dict
from specrl.models.llama import int8_kernels
from specrl.models.registry import resolve_checkpoint
from specrl.sampling import SamplingParams
from specrl.tasks.presets import preset_prompts

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", default=None,
                        help=f"comma-separated int8 kernels to measure (this CPU runs: {', '.join(int8_kernels())}, "
                             "and eager); default: the one the self-draft uses")
    args = parser.parse_args()
    kernels = args.kernels.split(",") if args.kernels else [None]
    unknown = [k for k in kernels if k is not None and k not in int8_kernels() + ("eager",)]
    if unknown:  # before the responses are sampled, not after
        parser.error(f"--kernels: {', '.join(unknown)} cannot run here; this CPU runs "
                     f"{', '.join(int8_kernels() + ('eager',))}")
    torch.set_num_threads(args.threads)
    backend = make_backend(BackendConfig(model=args.model))
    tokenizer, model = backend.tokenizer, backend.engine.model
    prompts = preset_prompts(args.model, tokenizer, args.samples, seed=0)
    result = backend.generate(prompts, SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=1))
    sequences = [(tokenizer.encode(p, add_special_tokens=False), c.token_ids) for p, c in zip(prompts, result.completions)]
    state = load_state_dict(resolve_checkpoint(args.model))
    rows = {}
    for drift in DRIFTS:
        model.load_weights(drifted(state, drift) if drift else state)
        for kernel in kernels:
            a = acceptance(model, sequences, kernel)
            name = kernel or "default"
            rows.setdefault(name, {})[f"drift {drift:g}"] = {"mean": round(float(a.mean()), 4),
                                                             "p10": round(float(a.quantile(0.1)), 4)}
            print(f"int8 self-draft ({name} kernel), policy drifted {drift:.0%}: mean acceptance {a.mean():.4f}, "
                  f"10th percentile {a.quantile(0.1):.4f}")
    print(json.dumps({"model": args.model, "response_tokens": sum(len(r) for _, r in sequences), "acceptance": rows}))


if __name__ == "__main__":
    main()
