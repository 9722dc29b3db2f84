"""Published figures the simulator is fitted on or validated against (plain data).

Sources are summarised in ../shared/REFERENCE.md; "(2nd-hand)" there applies here too.
Fitting data (used once, by `specrl.sim.fit`) and validation data (never fitted)
are kept apart on purpose.
"""
from __future__ import annotations

# --- Fitting data -----------------------------------------------------------------------
# SpecDecode-Bench, vLLM on one H100, Llama-3.1-8B: fitted step-time models (seconds).
VLLM_H100_TARGET = {"fixed_s": 5.89e-3, "per_token_s": 21e-6, "per_kv_token_s": 39e-9, "step_overhead_s": 1.21e-3}
VLLM_H100_EAGLE_DRAFT = {"fixed_s": 2.14e-3, "per_spec_token_s": 0.84e-6, "per_kv_token_s": 2.4e-9, "k": 3}

# Acceptance lengths of the same chain drafter on GSM8K at K = 1, 2, 3, 5, 7 (used to fit
# the shape of per-position acceptance: heterogeneity across requests and decay with depth).
VLLM_H100_ACCEPTANCE = {1: 1.69, 2: 2.12, 3: 2.38, 5: 2.65, 7: 2.75}


def vllm_h100_target_step(n_tokens, kv_tokens):
    """Published vLLM H100 Llama-3.1-8B iteration time for n batched tokens and kv cached tokens."""
    p = VLLM_H100_TARGET
    return p["fixed_s"] + p["per_token_s"] * n_tokens + p["per_kv_token_s"] * kv_tokens + p["step_overhead_s"]


def vllm_h100_eagle_draft(batch, k, kv_tokens):
    """Published vLLM H100 EAGLE drafting time per iteration (all K draft tokens)."""
    p = VLLM_H100_EAGLE_DRAFT
    return p["fixed_s"] + p["per_spec_token_s"] * batch * k + p["per_kv_token_s"] * kv_tokens


# --- Validation data (never fitted) ---------------------------------------------------------
# vLLM H100, chain K=3, Llama-3.1-8B + EAGLE, GSM8K: speculation speedup vs batch.
VLLM_H100_SPEEDUP = {1: 1.82, 128: 1.21}
VLLM_H100_K = 3

# EAGLE-3 in SGLang on one H100, Llama-3.1-8B-Instruct, MT-Bench: throughput speedup vs batch.
# 158.34 -> 373.25 tokens/s at batch 1 (SGLang docs); 1.38x at batch 64 (EAGLE-3 paper).
SGLANG_EAGLE3_SPEEDUP = {1: 373.25 / 158.34, 64: 1.38}

# The seed system, Qwen3-8B GRPO (RL-Zero), 32 GB200, synchronous, EAGLE-3 K=3 (2nd-hand).
SEED_8B = {
    "generation_s": (100.0, 56.6),
    "step_s": (151.2, 107.5),
    "acceptance_length_k3": 2.05,
    "generation_speedup_by_k": {3: 100.0 / 56.6, 5: 1.44, 7: 1.21},
}

# The seed's own simulator projection (not a measurement): Qwen3-235B-A22B async + spec, 2048 GB200.
SEED_235B_PROJECTION = {"rollout_speedup": 3.5, "end_to_end_speedup": 2.5, "gpus": 2048}

# SmolLM2-135M forward times with HF transformers at 1 thread, fp32, on an AVX2 EPYC (not this
# machine): {(batch, new tokens per sequence): seconds}.
CPU_SMOLLM2_FORWARD = {(1, 1): 0.089, (1, 5): 0.189, (8, 1): 0.219, (8, 5): 0.509, (32, 1): 0.449, (32, 5): 1.738}
