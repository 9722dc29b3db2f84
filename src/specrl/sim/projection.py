"""Run a scenario with speculation off and on, and sweep it (speedup grids, sensitivities).

`run_scenario` is the one entry point the command, the plots and the tests use:
it prices the scenario's RL step with K = 0 and with the scenario's K, in the
scenario's mode, and for async scenarios also the synchronous no-speculation
baseline. Speedups:
  rollout_speedup  generation time, speculation off / on (same mode, same pool);
  step_speedup     step time, speculation off / on (same mode);
  vs_sync_baseline (async only) sync no-speculation step / async + speculation step.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from specrl.sim.acceptance import acceptance_length
from specrl.sim.calibration import iteration_speedup
from specrl.sim.costs import Layout
from specrl.sim.drafters import get_drafter
from specrl.sim.hardware import get_device
from specrl.sim.iteration import Engine
from specrl.sim.models import get_model
from specrl.sim.rl_loop import (StepTimes, best_async_step, fsdp_comm_time, logprob_time, sync_step, train_time,
                                weight_transfer_time)
from specrl.sim.scenarios import Scenario
from specrl.sim.workload import Workload, expected_length, trained_tokens


def _stages(t: StepTimes) -> dict:
    return {"generation_s": round(t.generation, 3), "logprobs_s": round(t.logprobs, 3),
            "training_s": round(t.training, 3), "weight_sync_s": round(t.weight_sync, 3), "step_s": round(t.total, 3)}


def run_scenario(s: Scenario, async_style: str = "drain") -> dict:
    """Step times with speculation off and on, and the speedups (see module docstring)."""
    out = {"scenario": s.name, "mode": s.mode, "k": s.k, "acceptance_length": s.acceptance_length,
           "gpus": s.gpus, "device": s.device, "model": s.model, "layout": f"tp{s.layout.tp}xep{s.layout.ep}"}
    if s.mode == "sync":
        off, on = sync_step(s.setup(k=0)), sync_step(s.setup())
    else:
        (off, g_off), (on, g_on) = (best_async_step(s.setup(k=0), style=async_style),
                                    best_async_step(s.setup(), style=async_style))
        out.update(async_style=async_style, rollout_gpus_off=g_off, rollout_gpus_on=g_on)
        sync_off = sync_step(s.setup(k=0))
        out["sync_baseline"] = _stages(sync_off)
        out["vs_sync_baseline"] = round(sync_off.total / on.total, 4)
    out["spec_off"], out["spec_on"] = _stages(off), _stages(on)
    out["rollout_speedup"] = round(off.generation / on.generation, 4)
    out["step_speedup"] = round(off.total / on.total, 4)
    out["tokens_per_s_off"] = round(off.rollout.tokens_per_s, 1)
    out["tokens_per_s_on"] = round(on.rollout.tokens_per_s, 1)
    out["_trajectories"] = {"off": off.rollout.trajectory, "on": on.rollout.trajectory}
    return out


def trainer_scaling(s: Scenario, trainer_gpus: list[int], gpus_per_node: int = 8) -> list[dict]:
    """Async steps with the trainer on each of `trainer_gpus` devices (FSDP), the rollout pool fixed at the
    scenario's: where training stops being the bottleneck, and what speculation then buys.

    Per trainer size n: compute = logprobs + training at n devices, comm = `fsdp_comm_time` (NVLink
    within `gpus_per_node`, the network past it), step = max(generation, compute + comm) + weight
    broadcast, with speculation off and on (staleness 1: generation and training overlap)."""
    model, device = get_model(s.model), get_device(s.device)
    rollout_gpus = s.gpus
    tokens = trained_tokens(s.workload, s.shared_prompt)
    generation = {k: sync_step(replace(s, gpus=rollout_gpus).setup(k=k)).generation for k in (0, s.k)}
    broadcast = weight_transfer_time(model, device, s.layout.devices, colocated=False)
    rows = []
    for n in trainer_gpus:
        compute = (logprob_time(model, tokens, device, n, s.train_mfu) + train_time(model, tokens, device, n, s.train_mfu))
        comm = fsdp_comm_time(model, device, n, gpus_per_node)
        off, on = (max(generation[k], compute + comm) + broadcast for k in (0, s.k))
        rows.append({"trainer_gpus": n, "rollout_gpus": rollout_gpus, "training_s": round(compute, 3),
                     "fsdp_comm_s": round(comm, 3), "generation_off_s": round(generation[0], 3),
                     "generation_on_s": round(generation[s.k], 3), "step_off_s": round(off, 3),
                     "step_on_s": round(on, 3), "step_speedup": round(off / on, 4),
                     "bound_by": "training" if compute + comm > generation[0] else "generation"})
    return rows


def shared_prompt_table(s: Scenario, group_sizes=(8, 16), prompt_tokens=(None, 2048, 8192)) -> list[dict]:
    """What computing each prompt once per group saves the trainer, at the scenario's number of sequences per step,
    for each group size and prompt length (None: the scenario's own): the tokens its forward and backward run over
    (millions), each prompt once per sequence against once per group. Its logprob and training seconds scale with
    them (`train_time`, `logprob_time`); the rollouts are the same either way."""
    w = s.workload
    rows = []
    for prompt in prompt_tokens:
        for g in group_sizes:
            shaped = Workload(max(w.requests // g, 1), g, prompt or w.prompt_tokens, w.lengths)
            per_sequence, shared = (trained_tokens(shaped, flag) for flag in (False, True))
            rows.append({"prompt_tokens": shaped.prompt_tokens, "group_size": g,
                         "response_tokens": round(expected_length(w.lengths)),
                         "mtokens_per_sequence": round(per_sequence / 1e6, 3), "mtokens_shared": round(shared / 1e6, 3),
                         "trainer_speedup": round(per_sequence / shared, 3)})
    return rows


def scenario_engine(s: Scenario) -> Engine:
    model = get_model(s.model)
    return Engine(get_device(s.device), model, s.layout, get_drafter(s.drafter, model))


def sweep(s: Scenario, ks, batches) -> list[dict]:
    """Iteration-level speedup on one replica for each (K, live batch), at the scenario's acceptance.

    Cached tokens per sequence: prompt + half the mean response.
    """
    engine = scenario_engine(s)
    acc = s.acceptance()
    context = s.workload.prompt_tokens + expected_length(s.workload.lengths) / 2.0
    rows = []
    for k in ks:
        length = acceptance_length(acc, k) if k else 1.0
        for b in batches:
            rows.append({"k": k, "batch": b, "acceptance_length": round(length, 3),
                         "speedup": round(iteration_speedup(engine, b, k, length, context), 4)})
    return rows


LAYOUTS = {"TP8": Layout(tp=8), "TP4xEP8": Layout(tp=4, ep=8), "TP4xEP16": Layout(tp=4, ep=16),
           "TP8xEP32": Layout(tp=8, ep=32)}


def sensitivity(s: Scenario, async_style: str = "drain") -> dict:
    """Step speedup (async + spec vs async without) of a scenario as one assumption varies at a time."""
    def speedups(sc):
        r = run_scenario(sc, async_style)
        return r["rollout_speedup"], r["step_speedup"], r.get("vs_sync_baseline", r["step_speedup"])

    out = {"acceptance": [], "tail": [], "layout": []}
    for k, length in [(3, 1.8), (3, 2.2), (3, 2.47), (3, 2.8), (5, 3.2), (5, 3.6), (7, 4.2), (7, 5.0)]:
        out["acceptance"].append((f"K{k} tau{length}", *speedups(replace(s, k=k, acceptance_length=length))))
    for sigma, mass in [(0.5, 0.0), (0.7, 0.01), (0.9, 0.03), (1.1, 0.06), (1.3, 0.10)]:
        w = replace(s.workload, lengths=replace(s.workload.lengths, sigma=sigma, cap_mass=mass))
        out["tail"].append((f"sigma{sigma} cap{mass:.0%}", *speedups(replace(s, workload=w))))
    for name, layout in LAYOUTS.items():
        out["layout"].append((name, *speedups(replace(s, layout=layout))))
    return out


def acceptance_needed(s: Scenario, target: float, k: int = 5, async_style: str = "drain") -> float | None:
    """Smallest acceptance length at K for which the scenario's step speedup reaches `target` (bisection)."""
    from specrl.sim.acceptance import max_length
    from specrl.sim.scenarios import acceptance_shape

    lo, hi = 1.05, max_length(acceptance_shape(), k) - 0.01

    def f(length):
        return run_scenario(replace(s, k=k, acceptance_length=length), async_style)["step_speedup"] - target

    if f(hi) < 0:
        return None
    for _ in range(12):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return float(np.round(hi, 2))
