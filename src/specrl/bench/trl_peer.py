"""Benchmark: specrl's GRPO against TRL's `GRPOTrainer` on the same job, on this machine.

    pip install -e '.[peers]'
    specrl bench trl --config examples/sums/config.json --steps 4

The job is `specrl train --preset PRESET --config FILE` (SmolLM2-135M-Instruct and the shipped
example by default). Both sides get the same model weights, training problems in the same order,
prompts (the task's chat messages through the tokenizer's chat template), rewards (the task's
own named rewards with their weights, a raising user function scoring 0 on both), group size,
prompts per step, response cap, temperature, learning rate (constant, AdamW), gradient clipping,
clip range, KL coefficient (0), token-mean loss (TRL's `dapo`), no gradient
checkpointing (TRL's default turns it on) and steps. specrl
runs its preset's defaults (its drafts and their online adaptation included); TRL generates
with `transformers.generate`, as it does without vLLM, and trains in micro-batches of
`trl_micro_batch` rows (specrl sizes its own in tokens, `optim.micro_batch_tokens`). The runs alternate which goes first
across rounds; each step's time is the optimiser step's wall time, on the same torch threads.

Reported per side (medians over steps, the first step left out when there are 3 or more):
    step_seconds                  a whole GRPO step: generation, rewards, training
    rollout_tokens_per_s          response tokens per second of generation
    training_tokens_per_s         response tokens per second of the rest of the step
    reward_per_step               the mean reward of each step's samples (the same rewards on both)
Ratios are TRL / specrl (> 1: specrl is faster). Ends with one JSON line holding both configs.
"""
from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import ClassVar

import torch
from rich.table import Table

from specrl.backends import resolve_models
from specrl.bench import Bench
from specrl.models.checkpoint import load_tokenizer
from specrl.pipeline.config import TrainConfig, config_to_dict, load_config
from specrl.tasks import make_task
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class TRLBenchConfig:
    """One comparison: the same GRPO job under specrl and under TRL."""

    SECTION: ClassVar[str] = "bench trl"

    preset: str = "smollm2-135m"  # the job's preset
    config: str | None = "examples/sums/config.json"  # a run config file (JSON) on top of the preset
    steps: int = within(4, "[1, inf)")  # GRPO steps per run
    rounds: int = within(1, "[1, inf)")  # rounds of both runs, alternating which goes first
    threads: int = within(2, "[1, inf)")  # torch CPU threads for both
    seed: int = 0  # the job's seed, on both sides
    trl_micro_batch: int = within(8, "[1, inf)")  # TRL's sequences per forward/backward; divides the step's rows

    def __post_init__(self):
        check_fields(self)


def job_config(bench: TRLBenchConfig, run_dir: str) -> TrainConfig:
    return load_config(bench.preset, bench.config, [
        f"run.steps={bench.steps}", f"run.run_dir={run_dir}", f"run.seed={bench.seed}", "run.tensorboard=false",
        f"run.threads={bench.threads}", "run.checkpoint_every=0", "eval.every=0", "run.overwrite=true"])


def steady(values: list[float]) -> list[float]:
    """The steps after the first when there are 3 or more (the first pays one-off warm-up on both sides)."""
    return values[1:] if len(values) >= 3 else values


def side_summary(step_seconds: list[float], generation_seconds: list[float], tokens: list[int],
                 rewards: list[float]) -> dict:
    rest = [s - g for s, g in zip(step_seconds, generation_seconds)]
    return {"step_seconds": round(statistics.median(steady(step_seconds)), 2),
            "rollout_tokens_per_s": round(statistics.median(steady([t / g for t, g in zip(tokens, generation_seconds)])), 1),
            "training_tokens_per_s": round(statistics.median(steady([t / r for t, r in zip(tokens, rest)])), 1),
            "response_tokens_per_step": round(statistics.mean(tokens), 1),
            "reward_per_step": [round(r, 4) for r in rewards],
            "step_seconds_each": [round(s, 2) for s in step_seconds]}


def run_specrl(config: TrainConfig) -> dict:
    from specrl.pipeline.loop import Pipeline

    pipeline = Pipeline(config)
    pipeline.run()
    history = pipeline.history
    return side_summary([r["step_seconds"] for r in history],
                        [r["timing"].get("generation", 0.0) + r["timing"].get("reward", 0.0) for r in history],
                        [r["rollout_tokens"] for r in history], [r["reward_mean"] for r in history])


def trl_arguments(config: TrainConfig, output_dir: str, reward_weights: list[float], micro_batch: int):
    """TRL's GRPOConfig for the same job (see the module docstring), with the task's reward weights and
    `micro_batch` rows per forward/backward."""
    from trl import GRPOConfig

    rollout, grpo, optim = config.rollout, config.grpo, config.optim
    rows = rollout.prompts_per_step * grpo.group_size
    if rows % micro_batch:
        raise ValueError(f"trl_micro_batch ({micro_batch}) must divide the step's {rows} sequences")
    return GRPOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
        logging_steps=1, seed=config.run.seed, max_steps=config.run.steps, shuffle_dataset=False,
        per_device_train_batch_size=micro_batch, gradient_accumulation_steps=rows // micro_batch,
        num_generations=grpo.group_size, max_completion_length=rollout.max_tokens, temperature=rollout.temperature,
        top_p=rollout.top_p, top_k=rollout.top_k, learning_rate=optim.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=optim.weight_decay, max_grad_norm=optim.max_grad_norm or 1e9, beta=grpo.kl_coef,
        epsilon=grpo.clip_low, epsilon_high=grpo.clip_high, loss_type="dapo", num_iterations=1,
        scale_rewards="group" if grpo.scale_advantages else "none",
        importance_sampling_level=grpo.ratio_level, mask_truncated_completions=grpo.overlong == "filter",
        reward_weights=reward_weights, disable_dropout=True,
        gradient_checkpointing=False, dataloader_num_workers=0)  # TRL's default recomputes activations; specrl does not


def run_trl(config: TrainConfig, output_dir: str, micro_batch: int) -> tuple[dict, dict]:
    """-> (summary, TRL's arguments as a dict)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    task = make_task(config.task)
    policy = resolve_models(config.backend).policy
    tokenizer = load_tokenizer(policy)
    count = config.run.steps * config.rollout.prompts_per_step
    dataset = Dataset.from_list([{"prompt": task.messages(task[i]), "position": i} for i in range(count)])

    def reward_of(name: str):
        def reward(prompts, completions, position, **_):
            return [task.score(c[-1]["content"], task[i]).parts[name] for c, i in zip(completions, position)]
        reward.__name__ = name.replace(":", "_").replace("/", "_").replace(".", "_")
        return reward

    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32, use_safetensors=True,
                                                 trust_remote_code=False)
    args = trl_arguments(config, output_dir, list(task.rewards.weights.values()), micro_batch)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_of(n) for n in task.rewards.weights],
                          args=args, train_dataset=dataset, processing_class=tokenizer)
    generation = [0.0]
    generate = trainer.model.generate

    def timed_generate(*a, **k):
        start = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            generation[0] += time.perf_counter() - start

    trainer.model.generate = timed_generate
    steps, generations, tokens, rewards = [], [], [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start, generation[0] = time.perf_counter(), 0.0

        def on_step_end(self, *_, **__):
            steps.append(time.perf_counter() - self.start)
            generations.append(generation[0])

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))
                rows = config.rollout.prompts_per_step * config.grpo.group_size
                tokens.append(round(float(logs["completions/mean_length"]) * rows))

    trainer.add_callback(Clock())
    trainer.train()
    return side_summary(steps, generations, tokens, rewards), args.to_dict()


def run_trl_bench(bench: TRLBenchConfig, progress=None) -> dict:
    try:
        import trl  # noqa: F401
    except ImportError:
        raise ValueError("specrl bench trl needs TRL, an optional extra: pip install -e '.[peers]'") from None
    torch.set_num_threads(bench.threads)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        config = job_config(bench, f"{tmp}/specrl")
        trl_args = {}
        for r in range(bench.rounds):
            sides = {}
            for side in (("specrl", "trl") if r % 2 == 0 else ("trl", "specrl")):
                if side == "specrl":
                    sides[side] = run_specrl(config)
                else:
                    sides[side], trl_args = run_trl(config, f"{tmp}/trl", bench.trl_micro_batch)
                torch.set_num_threads(bench.threads)
            rounds.append(sides)
            if progress is not None:
                progress(r + 1)

    def median(side: str, key: str) -> float:
        return round(statistics.median(r[side][key] for r in rounds), 2)

    out = {"bench": "trl", "steps": bench.steps, "rounds": bench.rounds, "threads": bench.threads}
    for side in ("specrl", "trl"):
        out[side] = {key: median(side, key) for key in ("step_seconds", "rollout_tokens_per_s", "training_tokens_per_s")}
        out[side]["reward_per_step"] = rounds[-1][side]["reward_per_step"]
        out[side]["rounds"] = [r[side] for r in rounds]
    for key in ("step_seconds",):
        out[f"{key}_trl_over_specrl"] = round(out["trl"][key] / out["specrl"][key], 2)
    for key in ("rollout_tokens_per_s", "training_tokens_per_s"):
        out[f"{key}_specrl_over_trl"] = round(out["specrl"][key] / out["trl"][key], 2)
    out["specrl_config"] = config_to_dict(config)
    out["trl_config"] = {k: v for k, v in trl_args.items() if not k.startswith("_") and not callable(v)}
    out["bench_config"] = dataclasses.asdict(bench)
    return out


def report(summary: dict, config: TRLBenchConfig, console) -> None:
    """Each side's seconds per step, rollout and training tokens per second and reward per step."""
    table = Table(title=f"GRPO on the same job: {config.preset} + {config.config}, {config.steps} steps")
    for column in ("", "s / step", "rollout tok/s", "training tok/s", "reward per step"):
        table.add_column(column)
    for side in ("specrl", "trl"):
        row = summary[side]
        table.add_row(side, f"{row['step_seconds']:.1f}", f"{row['rollout_tokens_per_s']:.0f}",
                      f"{row['training_tokens_per_s']:.0f}", " ".join(f"{r:.2f}" for r in row["reward_per_step"]))
    console.print(table)


BENCH = Bench(TRLBenchConfig, run_trl_bench, report, steps=lambda c: c.rounds,
              help="specrl's GRPO against TRL's GRPOTrainer on the same job (needs the peers extra)",
              description="Runs the job `specrl train --preset PRESET --config CONFIG` for --steps steps under specrl "
                          "and under TRL's GRPOTrainer (pip install -e '.[peers]'): the same model, problems, prompts, "
                          "rewards, group size, prompts per step, response cap, temperature, learning rate and clip "
                          "range. Reports each side's seconds per step, rollout and training tokens per second, and "
                          "reward per step, and both configs in full.")
