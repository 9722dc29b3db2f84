"""Calibration and validation harness: predicted vs published (or measured), with the error.

Every row names its source, whether the value was used to fit something ("fit":
its error is small by construction) or is a held-out check ("validate"), and the
error bound the project targets (None: reported, no target). Error = predicted /
reference - 1.

Fitted once, used everywhere: the GPU efficiencies (hardware.GPU_EFFICIENCY, from
the published H100 step models), the acceptance shape (from the H100 K-sweep),
and the CPU efficiencies (cpu_calibration.json, from a measurement on this machine).
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from specrl.sim import published
from specrl.sim.costs import Layout
from specrl.sim.drafters import get_drafter
from specrl.sim.hardware import CPU_CALIBRATION_PATH, get_device
from specrl.sim.iteration import Engine
from specrl.sim.models import get_model
from specrl.sim.rl_loop import sync_step
from specrl.sim.scenarios import get_scenario

# Assumed mean cached tokens per sequence during decode in the published serving benchmarks:
# prompt plus half the answer. GSM8K: ~100-token questions, ~200-token answers -> 256.
# MT-Bench: ~100-token turns, ~500-token answers -> 384. Not published; stated here once.
SERVING_CONTEXT_TOKENS = 256
MT_BENCH_CONTEXT_TOKENS = 384
# SGLang's EAGLE-3 default chain depth (speculative_num_steps).
SGLANG_STEPS = 5


def _row(name, source, kind, reference, predicted, bound):
    error = predicted / reference - 1.0
    ok = None if bound is None else abs(error) <= bound
    return {"name": name, "source": source, "kind": kind, "published": float(f"{reference:.5g}"),
            "predicted": float(f"{float(predicted):.5g}"), "error": round(float(error), 4), "bound": bound, "ok": ok}


def iteration_speedup(engine: Engine, batch: int, k: int, length: float, context: float = SERVING_CONTEXT_TOKENS) -> float:
    """Throughput speedup of speculation at a fixed live batch: tau * T_plain / T_spec."""
    kv = batch * context
    return float(length * engine.iteration_time(batch, 0, kv) / engine.iteration_time(batch, k, kv))


def vllm_h100_rows() -> list[dict]:
    """vLLM H100 Llama-3.1-8B + EAGLE, K=3: speedup vs batch at the published acceptance length."""
    model = get_model("llama-3.1-8b")
    engine = Engine(get_device("h100"), model, Layout(), get_drafter("eagle", model))
    k = published.VLLM_H100_K
    length = published.VLLM_H100_ACCEPTANCE[k]
    return [
        _row(f"vllm-h100 speedup batch {b}", "SpecDecode-Bench", "validate", ref,
             iteration_speedup(engine, b, k, length), 0.15)
        for b, ref in published.VLLM_H100_SPEEDUP.items()
    ]


def sglang_eagle3_rows() -> list[dict]:
    """SGLang EAGLE-3 on H100: acceptance length inferred at batch 1 (fit), batch 64 predicted."""
    model = get_model("llama-3.1-8b")
    engine = Engine(get_device("h100"), model, Layout(), get_drafter("eagle3", model))
    k = SGLANG_STEPS
    ctx = MT_BENCH_CONTEXT_TOKENS
    ratio = float(engine.iteration_time(1, 0, ctx) / engine.iteration_time(1, k, ctx))
    length = min(published.SGLANG_EAGLE3_SPEEDUP[1] / ratio, k + 1.0)
    rows = []
    for b, ref in published.SGLANG_EAGLE3_SPEEDUP.items():
        kind = "fit" if b == 1 else "validate"
        rows.append(_row(f"sglang-eagle3 speedup batch {b} (tau={length:.2f})", "EAGLE-3 paper / SGLang docs",
                         kind, ref, iteration_speedup(engine, b, k, length, ctx), None if b == 1 else 0.15))
    return rows


def seed_8b_rows() -> list[dict]:
    """The seed's 8B synchronous step: generation and step speedups (K=3), K=5/7, absolute times. The seed ran
    a fixed K, so these rows do too (`controller="fixed"`); `specrl simulate --scenario seed-8b-sync` runs the
    planner users get."""
    scenario = replace(get_scenario("seed-8b-sync"), controller="fixed")
    base = sync_step(scenario.setup(k=0))
    rows = []
    for k, ref in published.SEED_8B["generation_speedup_by_k"].items():
        spec = sync_step(scenario.setup(k=k))
        rows.append(_row(f"seed-8b generation speedup K={k}", "seed (2nd-hand)", "validate", ref,
                         base.generation / spec.generation, 0.10 if k == 3 else None))
        if k == 3:
            step_ref = published.SEED_8B["step_s"][0] / published.SEED_8B["step_s"][1]
            rows.append(_row("seed-8b step speedup K=3", "seed (2nd-hand)", "validate", step_ref,
                             base.total / spec.total, 0.10))
            rows.append(_row("seed-8b generation seconds, spec off", "seed (2nd-hand)", "validate",
                             published.SEED_8B["generation_s"][0], base.generation, None))
            rows.append(_row("seed-8b step seconds, spec off", "seed (2nd-hand)", "validate",
                             published.SEED_8B["step_s"][0], base.total, None))
    return rows


def cpu_rows(path=CPU_CALIBRATION_PATH) -> list[dict]:
    """CPU forward times: held-out measurements on this machine (bounded), and the REFERENCE table (other CPU)."""
    device = get_device("cpu")
    data = json.loads(path.read_text())
    rows = []
    for rec in data["holdout"]:
        model = get_model(rec["model"])
        engine = Engine(device, model, Layout())
        pred = float(engine.target_time(rec["batch"], rec["q"] - 1, rec["batch"] * rec["ctx"]))
        rows.append(_row(f"cpu {rec['model']} forward b={rec['batch']} q={rec['q']}", "measured here (held out)",
                         "validate", rec["seconds"], pred, 0.15))
    model = get_model("smollm2-135m")
    engine = Engine(device, model, Layout())
    for (b, q), ref in published.CPU_SMOLLM2_FORWARD.items():
        pred = float(engine.target_time(b, q - 1, b * 32))
        rows.append(_row(f"cpu smollm2 forward b={b} q={q}", "REFERENCE (AVX2 EPYC, not this CPU)", "validate",
                         ref, pred, None))
    return rows


def calibration_table() -> list[dict]:
    """Every calibration and validation row."""
    return vllm_h100_rows() + sglang_eagle3_rows() + seed_8b_rows() + cpu_rows()


PROPOSER_DRAFTERS = {"ngram": "ngram", "suffix": "suffix", "group-suffix": "suffix", "eagle3": "eagle3",
                     "eagle": "eagle3", "mtp": "mtp"}
DRAFT_MODEL_PROPOSERS = ("draft", "draft-model", "draft_model")  # a bench record's names for a draft model


def _drafter_for(proposer: str, model_name: str) -> str:
    if proposer in PROPOSER_DRAFTERS:
        return PROPOSER_DRAFTERS[proposer]
    if proposer in DRAFT_MODEL_PROPOSERS:
        return "draft:tiny-draft" if model_name == "tiny" else "draft:" + model_name
    if proposer.startswith("draft:"):
        return proposer
    raise ValueError(f"unknown proposer {proposer!r} in bench record")


def validate_against_bench(records: list[dict], device: str = "cpu", context: float = 32.0,
                           bound: float = 0.15) -> list[dict]:
    """Compare predicted speculation speedups with measured `specrl bench rollout` records.

    records: dicts with model, proposer, batch, k, speedup, acceptance_length (tokens_per_s_* optional;
        an optional `context` gives cached tokens per sequence, default `context`).
    The measured acceptance length is an input (the simulator does not predict acceptance here);
    the prediction is tau * T_plain(batch) / T_spec(batch, k) on `device`.
    Returns one row per record: the record's keys plus predicted_speedup, error, ok.
    """
    dev = get_device(device)
    out = []
    for rec in records:
        model = get_model(rec["model"])
        drafter = get_drafter(_drafter_for(rec["proposer"], rec["model"]), model)
        engine = Engine(dev, model, Layout(), drafter)
        k, batch = int(rec["k"]), int(rec["batch"])
        pred = iteration_speedup(engine, batch, k, float(rec["acceptance_length"]), rec.get("context", context))
        error = pred / float(rec["speedup"]) - 1.0
        out.append({**rec, "predicted_speedup": round(pred, 4), "error": round(error, 4),
                    "ok": bool(abs(error) <= bound)})
    return out


def summary(rows: list[dict]) -> dict:
    """Worst bounded error and how many rows met their bound."""
    bounded = [r for r in rows if r["bound"] is not None]
    worst = max(bounded, key=lambda r: abs(r["error"]) / r["bound"]) if bounded else None
    return {"rows": len(rows), "bounded": len(bounded), "within_bound": sum(bool(r["ok"]) for r in bounded),
            "worst": None if worst is None else {"name": worst["name"], "error": worst["error"], "bound": worst["bound"]},
            "max_abs_error_bounded": float(np.max([abs(r["error"]) for r in bounded])) if bounded else None}
