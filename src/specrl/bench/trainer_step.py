"""What one GRPO optimiser step of the policy trainer costs: packed shared prompts against padded rows.

    python -m specrl.bench.trainer_step [--model smollm2-135m] [--device cpu|cuda] [--precision fp32|bf16]
                                        [--prompts 4] [--group-size 8] [--prompt-tokens 60]
                                        [--response-tokens 20,128] [--rounds 5]

On a random-weight Hugging Face checkpoint of `--model`'s shape (the simulator's catalogue,
`specrl.sim.models`), it times two ways of taking the same step on the same batch:
    padded   every sequence its own right-padded row `prompt + response`, `--padded-micro-batch` rows
             per forward/backward, logits at every position (`rl.padded_reference`: how the trainer
             computed before packing)
    packed   `PolicyTrainer.step`: each group's prompt once, logits only where a response token is
             predicted, micro-batches of `--micro-batch-tokens` tokens (`rl.packing`)
The batch is the SmolLM2 preset's job shape by default: 4 prompts of 60 tokens, 8 responses each,
their lengths drawn uniformly from 20 to 128. The two alternate within each round (round 0 warms up);
the ratio is the median of the rounds' padded / packed. Each side also reports the tokens its
forward and backward run over and the positions its LM head runs at, the counts the saving follows.
Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from specrl.bench.verify_cost import dense_spec
from specrl.rl.grpo import GRPOConfig
from specrl.rl.packing import micro_batches, pack
from specrl.rl.padded_reference import padded_step
from specrl.rl.trainer import OptimConfig, PolicyTrainer
from specrl.sampling import SamplingParams
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


def job(vocab: int, prompts: int, group_size: int, prompt_tokens: int, lengths: tuple[int, int], seed: int = 0):
    """A GRPO batch: `prompts` groups of `group_size` responses, lengths uniform in `lengths`."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids, responses = [], []
    for _ in range(prompts):
        prompt = torch.randint(0, vocab, (prompt_tokens,), generator=g).tolist()
        for _ in range(group_size):
            prompt_ids.append(prompt)
            length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
            responses.append(torch.randint(0, vocab, (length,), generator=g).tolist())
    behaviour = [[-5.0] * len(r) for r in responses]
    return prompt_ids, responses, behaviour, torch.linspace(-1, 1, len(responses))


def token_counts(prompts, responses, padded_micro_batch: int, budget: int) -> dict:
    """Tokens each layout runs its body over, and the positions each runs the LM head at."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    padded = sum(len(part) * max(part) for part in (lengths[s:s + padded_micro_batch]
                                                    for s in range(0, len(lengths), padded_micro_batch)))
    parts = micro_batches(prompts, responses, budget)
    packed = sum(pack(prompts, responses, rows, budget).tokens for rows in parts)
    return {"padded_tokens": padded, "packed_tokens": packed, "padded_head_positions": padded,
            "packed_head_positions": sum(len(r) for r in responses), "packed_micro_batches": len(parts)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default="smollm2-135m", help="a dense model of the simulator's catalogue")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--prompts", type=int, default=4, help="groups per step (rollout.prompts_per_step)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=60)
    parser.add_argument("--response-tokens", default="20,128", help="MIN,MAX response length (uniform)")
    parser.add_argument("--padded-micro-batch", type=int, default=8, help="rows per forward/backward, padded side")
    parser.add_argument("--micro-batch-tokens", type=int, default=OptimConfig.micro_batch_tokens,
                        help="tokens per forward/backward, packed side (default: the trainer's)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    low, high = (int(x) for x in args.response_tokens.split(","))
    vocab = get_model(args.model).vocab
    optim = OptimConfig(lr=1e-6, precision=args.precision, micro_batch_tokens=args.micro_batch_tokens)
    with tempfile.TemporaryDirectory() as folder:
        params = save_random_checkpoint(args.model, folder)
        trainer = PolicyTrainer(folder, GRPOConfig(group_size=args.group_size), optim, SamplingParams(), pad_id=0,
                                device=args.device)
    batch = job(vocab, args.prompts, args.group_size, args.prompt_tokens, (low, high))
    counts = token_counts(batch[0], batch[1], args.padded_micro_batch, args.micro_batch_tokens)
    sides = {"padded": lambda: padded_step(trainer, *batch, args.padded_micro_batch),
             "packed": lambda: trainer.step(*batch)}
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    print(f"{args.model} ({params / 1e6:.0f}M) on {args.device} {args.precision}: {args.prompts} prompts of "
          f"{args.prompt_tokens} tokens x {args.group_size} responses of {low}-{high} tokens; {counts}")
    for r in range(args.rounds + 1):  # round 0 warms up
        for side in (sides if r % 2 else list(sides)[::-1]):
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            sides[side]()
            if args.device == "cuda":
                torch.cuda.synchronize()
            if r:
                seconds[side].append(time.perf_counter() - start)
        if r:
            print(f"round {r}: padded {seconds['padded'][-1]:.2f} s, packed {seconds['packed'][-1]:.2f} s", flush=True)
    ratios = [a / b for a, b in zip(seconds["padded"], seconds["packed"])]
    summary = {"bench": "trainer_step", "model": args.model, "device": args.device, "precision": args.precision,
               "threads": args.threads, "prompts": args.prompts, "group_size": args.group_size,
               "prompt_tokens": args.prompt_tokens, "response_tokens": [low, high],
               "padded_micro_batch": args.padded_micro_batch, "micro_batch_tokens": args.micro_batch_tokens,
               **counts, "padded_step_s": statistics.median(seconds["padded"]),
               "packed_step_s": statistics.median(seconds["packed"]), "speedup_median": statistics.median(ratios),
               "rounds": args.rounds}
    print(f"padded {summary['padded_step_s']:.2f} s, packed {summary['packed_step_s']:.2f} s per step: "
          f"{summary['speedup_median']:.2f}x")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
