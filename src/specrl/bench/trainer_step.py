"""What one GRPO optimiser step of the policy trainer costs, by device and precision.

    python -m specrl.bench.trainer_step [--device cuda] [--models smollm2-135m,llama-3.2-1b]
                                        [--sequences 32] [--prompt-tokens 64] [--response-tokens 192]
                                        [--precisions fp32,bf16] [--rounds 5]

For each model of the simulator's catalogue (`specrl.sim.models`; dense Llama-shaped ones) it saves a
random-weight Hugging Face checkpoint of that shape, loads it into `PolicyTrainer` on `--device` once per
precision (`optim.precision`: fp32, or bf16 autocast with fp32 master weights), and times
`PolicyTrainer.step` on a batch of random prompts and responses of the given lengths (the GRPO batch:
prompts_per_step x group_size sequences), in micro-batches of `--micro-batch`. The precisions alternate
within each round; medians of `--rounds`. Each row reports trained tokens per second and the model FLOP
utilisation against the simulator's device peak (6 x parameters x tokens per step). Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from specrl.bench.verify_cost import dense_spec, sim_device_name
from specrl.rl.grpo import GRPOConfig
from specrl.rl.trainer import OptimConfig, PolicyTrainer
from specrl.sampling import SamplingParams
from specrl.sim.hardware import get_device
from specrl.sim.models import get_model


def save_random_checkpoint(name: str, folder: str) -> int:
    """A random-weight Llama of `name`'s shape, saved as safetensors; returns its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = dense_spec(name)
    config = LlamaConfig(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn,
                         num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                         num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, tie_word_embeddings=spec.tied,
                         max_position_embeddings=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(name: str, device: str, precisions: list[str], sequences: int, prompt_tokens: int,
            response_tokens: int, micro_batch: int, rounds: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        params = save_random_checkpoint(name, folder)
        vocab = get_model(name).vocab
        trainers = {p: PolicyTrainer(folder, GRPOConfig(), OptimConfig(lr=1e-6, precision=p, micro_batch_size=micro_batch),
                                     SamplingParams(), pad_id=0, device=device) for p in precisions}
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (sequences, prompt_tokens), generator=g).tolist()
    responses = torch.randint(0, vocab, (sequences, response_tokens), generator=g).tolist()
    behaviour = [[-5.0] * response_tokens for _ in range(sequences)]
    advantages = torch.linspace(-1, 1, sequences)
    seconds: dict[str, list[float]] = {p: [] for p in precisions}
    for r in range(rounds + 1):  # round 0 warms up (allocator, kernels, autocast caches)
        for p in (precisions if r % 2 else precisions[::-1]):
            synchronize(device)
            start = time.perf_counter()
            trainers[p].step(prompts, responses, behaviour, advantages)
            synchronize(device)
            if r:
                seconds[p].append(time.perf_counter() - start)
    tokens = sequences * (prompt_tokens + response_tokens)
    peak = get_device(sim_device_name(torch.device(device))).peak_flops
    rows = []
    for p in precisions:
        s = statistics.median(seconds[p])
        rows.append({"model": name, "precision": p, "step_s": s, "tokens_per_s": tokens / s,
                     "mfu": 6 * params * tokens / s / peak, "params": params})
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", default="smollm2-135m,llama-3.2-1b")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--sequences", type=int, default=32, help="sequences per step (prompts x group size)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=192)
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward")
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per precision (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    precisions = args.precisions.split(",")
    label = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device {label}: {args.sequences} sequences x ({args.prompt_tokens} + {args.response_tokens}) tokens, "
          f"micro-batches of {args.micro_batch}, median of {args.rounds}")
    print(f"{'model':>14} {'precision':>9} {'step s':>8} {'tokens/s':>10} {'MFU':>6}")
    rows = []
    for name in args.models.split(","):
        for r in measure(name, args.device, precisions, args.sequences, args.prompt_tokens, args.response_tokens,
                         args.micro_batch, args.rounds):
            rows.append(r)
            print(f"{r['model']:>14} {r['precision']:>9} {r['step_s']:>8.3f} {r['tokens_per_s']:>10.0f} "
                  f"{r['mfu']:>6.1%}", flush=True)
    summary = {"bench": "trainer_step", "device": label, "sequences": args.sequences,
               "prompt_tokens": args.prompt_tokens, "response_tokens": args.response_tokens,
               "micro_batch": args.micro_batch, "rounds": args.rounds, "rows": rows}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
