"""`specrl eval MODEL|RUN_DIR`: held-out pass@1 (pass@k with --n) of a model or a run's last checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

from specrl.backends import BackendConfig, make_backend
from specrl.commands.common import add_threads_flag, progress_bar, set_threads
from specrl.pipeline.config import PRESETS, load_config
from specrl.pipeline.evaluation import EvalConfig, evaluate
from specrl.pipeline.resume import latest_checkpoint
from specrl.tasks import TaskConfig, make_task
from specrl.validation import choices


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="held-out pass@1 (and pass@k) of a model or a training run",
        description="Samples --n responses to each of --prompts held-out problems (a generated task's last ones, "
                    "or a file task's held-out rows: training never draws them) and scores them with the task's "
                    "rewards; a sample is solved when its reward reaches task.pass_threshold. pass@k is the "
                    "unbiased estimator 1 - C(n-c, k)/C(n, k), averaged over problems, with a 95%% confidence "
                    "interval over problems. MODEL is a registered name or checkpoint folder (the task comes from "
                    "the model's preset, a --config file's task section, or --task); RUN_DIR is a specrl run folder "
                    "(its task, response length and last checkpoint). Ends with one JSON line.")
    p.add_argument("target", metavar="MODEL|RUN_DIR")
    p.add_argument("--task", default=None, help="task name (default: the run's task, or the model's preset task)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a run config file (JSON) whose task a MODEL is evaluated on, rendered as training would "
                        "render it: e.g. a model's pass@1 on your dataset before training")
    p.add_argument("--n", type=int, default=1, help="samples per problem; pass@k is reported for k = 1, 2, 4, .. <= n")
    p.add_argument("--prompts", type=int, default=None,
                   help="held-out problems (default: 200, or all of a file task's held-out rows when fewer)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature; 0 = greedy (default: a run's or config file's eval.temperature, else 1)")
    p.add_argument("--max-tokens", type=int, default=None, help="response cap (default: the run's or preset's)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--batch", type=int, default=64, help="prompts per generate call (default 64)")
    p.add_argument("--proposer", choices=choices(BackendConfig, "proposer"), default="none",
                   help="speculation while evaluating (exact: it changes the speed, not the result's distribution)")
    add_threads_flag(p)
    p.set_defaults(func=run)


def _target(target: str, task_name: str | None, config_file: str | None) -> tuple[str, TaskConfig, int, float, str]:
    """(policy checkpoint or model name, task config, default max tokens and temperature, what was evaluated). A
    run's task
    config is the run's own, so its prompts are rendered exactly as training rendered them; a model's is its
    preset's, with a run config file's (`--config`) on top: the job a run with that file would train on."""
    run_dir = Path(target)
    if (run_dir / "config.json").is_file() and (run_dir / "checkpoints").is_dir():
        config = load_config(file=str(run_dir / "config.json"))
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise ValueError(f"{run_dir}: the run has no checkpoint yet")
        task = config.task if task_name in (None, config.task.name) else TaskConfig(name=task_name)
        return str(checkpoint / "policy"), task, config.rollout.max_tokens, config.eval.temperature, str(checkpoint)
    if config_file is not None:
        config = load_config(target if target in PRESETS else None, file=config_file)
        task = config.task if task_name in (None, config.task.name) else TaskConfig(name=task_name)
        return target, task, config.rollout.max_tokens, config.eval.temperature, target
    preset = PRESETS.get(target, PRESETS["smollm2-135m"])
    task = TaskConfig(**preset["task"])
    if task_name is not None and task_name != task.name:
        task = TaskConfig(name=task_name)
    return target, task, preset["rollout"]["max_tokens"], 1.0, target


def run(args) -> dict:
    threads = set_threads(args.threads)
    if args.config is not None and Path(args.target, "config.json").is_file():
        raise ValueError(f"--config is for a model; {args.target} is a run folder, evaluated on its own task config")
    model, task_config, max_tokens, temperature, evaluated = _target(args.target, args.task, args.config)
    temperature = temperature if args.temperature is None else args.temperature
    task = make_task(task_config)
    prompts = args.prompts or min(200, task.held_out_size)
    eval_config = EvalConfig(prompts=prompts, n=args.n, temperature=temperature, batch=args.batch)
    backend = make_backend(BackendConfig(model=model, proposer=args.proposer))
    with progress_bar(f"eval {task_config.name}", prompts) as update:
        result = evaluate(backend, task, backend.tokenizer, eval_config, args.max_tokens or max_tokens, args.seed,
                          progress=lambda done, total: update(done))
    described = {"path": task_config.path} if task_config.name == "file" else \
        {"difficulty": json.loads(json.dumps(task_config.difficulty))}
    return {"evaluated": evaluated, "task": task_config.name, **described, "temperature": temperature,
            "max_tokens": args.max_tokens or max_tokens, "proposer": args.proposer, "threads": threads, **result,
            "tokens_per_s": round(result["tokens"] / max(result["generation_seconds"], 1e-9), 1)}
