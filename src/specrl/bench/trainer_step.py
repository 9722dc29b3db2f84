"""What one GRPO optimiser step of the policy trainer costs: packed shared prompts against padded rows.

    specrl bench trainer-step [--model smollm2-135m] [--device cpu|cuda] [--precision fp32|bf16]
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

import dataclasses
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from rich.table import Table

from specrl.bench import Bench
from specrl.bench.verify_cost import dense_spec
from specrl.rl.grpo import GRPOConfig
from specrl.rl.packing import micro_batches, pack
from specrl.rl.padded_reference import padded_step
from specrl.rl.trainer import OptimConfig, PolicyTrainer
from specrl.sampling import SamplingParams
from specrl.sim.models import get_model
from specrl.validation import check_fields, within


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


@dataclass(frozen=True)
class TrainerStepBenchConfig:
    """One comparison: the packed and the padded trainer step on one random checkpoint and one batch."""

    SECTION: ClassVar[str] = "bench trainer-step"

    model: str = "smollm2-135m"  # a dense model of the simulator's catalogue (its shape, random weights)
    device: Literal["cpu", "cuda"] = "cpu"
    precision: Literal["fp32", "bf16"] = "fp32"
    prompts: int = within(4, "[1, inf)")  # groups per step (rollout.prompts_per_step)
    group_size: int = within(8, "[1, inf)")  # responses per prompt
    prompt_tokens: int = within(60, "[1, inf)")
    response_tokens: tuple[int, ...] = (20, 128)  # MIN,MAX response length (uniform)
    padded_micro_batch: int = within(8, "[1, inf)")  # rows per forward/backward, padded side
    micro_batch_tokens: int = within(OptimConfig.micro_batch_tokens, "[1, inf)")  # packed side (the trainer's)
    rounds: int = within(5, "[1, inf)")  # timed rounds after a warm-up round; medians are reported
    threads: int | None = within(2, "[1, inf)")  # torch CPU threads

    def __post_init__(self):
        check_fields(self)
        if len(self.response_tokens) != 2 or not 1 <= self.response_tokens[0] <= self.response_tokens[1]:
            raise ValueError(f"bench trainer-step: response_tokens must be MIN,MAX with 1 <= MIN <= MAX, got "
                             f"{self.response_tokens}")


def run_trainer_step_bench(config: TrainerStepBenchConfig, progress=None) -> dict:
    """Both steps alternating on the same batch; medians of the rounds and their ratio."""
    low, high = config.response_tokens
    vocab = get_model(config.model).vocab
    optim = OptimConfig(lr=1e-6, precision=config.precision, micro_batch_tokens=config.micro_batch_tokens)
    with tempfile.TemporaryDirectory() as folder:
        params = save_random_checkpoint(config.model, folder)
        trainer = PolicyTrainer(folder, GRPOConfig(group_size=config.group_size), optim, SamplingParams(), pad_id=0,
                                device=config.device)
    batch = job(vocab, config.prompts, config.group_size, config.prompt_tokens, (low, high))
    counts = token_counts(batch[0], batch[1], config.padded_micro_batch, config.micro_batch_tokens)
    sides = {"padded": lambda: padded_step(trainer, *batch, config.padded_micro_batch),
             "packed": lambda: trainer.step(*batch)}
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(config.rounds + 1):  # round 0 warms up
        for side in (sides if r % 2 else list(sides)[::-1]):
            if config.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            sides[side]()
            if config.device == "cuda":
                torch.cuda.synchronize()
            if r:
                seconds[side].append(time.perf_counter() - start)
        if progress is not None:
            progress(r + 1)
    ratios = [a / b for a, b in zip(seconds["padded"], seconds["packed"])]
    return {"bench": "trainer_step", **dataclasses.asdict(config), "threads": torch.get_num_threads(),
            "parameters": params, **counts, "padded_step_s": statistics.median(seconds["padded"]),
            "packed_step_s": statistics.median(seconds["packed"]), "speedup_median": statistics.median(ratios),
            "padded_s_per_round": seconds["padded"], "packed_s_per_round": seconds["packed"]}


def report(summary: dict, config: TrainerStepBenchConfig, console) -> None:
    low, high = config.response_tokens
    console.print(f"{config.model} ({summary['parameters'] / 1e6:.0f}M) on {config.device} {config.precision}: "
                  f"{config.prompts} prompts of {config.prompt_tokens} tokens x {config.group_size} responses of "
                  f"{low}-{high} tokens")
    table = Table(title="one GRPO trainer step, padded rows against packed shared prompts")
    for column in ("layout", "body tokens", "LM-head positions", "s / step (median)"):
        table.add_column(column)
    for side in ("padded", "packed"):
        table.add_row(side, str(summary[f"{side}_tokens"]), str(summary[f"{side}_head_positions"]),
                      f"{summary[f'{side}_step_s']:.2f}")
    console.print(table)
    console.print(f"packed is {summary['speedup_median']:.2f}x the padded step (median of {config.rounds} rounds)")


BENCH = Bench(TrainerStepBenchConfig, run_trainer_step_bench, report, steps=lambda c: c.rounds + 1,
              help="one GRPO trainer step: packed shared prompts against padded rows, alternating",
              description=__doc__.split("\n\n", 1)[1].split("Ends with")[0].strip())

