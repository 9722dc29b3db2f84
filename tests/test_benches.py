"""The benchmarks: inputs whose defaults fit the chosen model, bad values refused before any engine starts, and
the small benches run whole."""
from __future__ import annotations

import importlib.util
import json

import pytest

from specrl import cli
from specrl.bench.rollout_bench import RolloutBenchConfig, bench_inputs, run_rollout_bench
from specrl.kernels import small_gemm


def test_default_response_cap_fits_tinys_short_context():
    prompts, max_tokens = bench_inputs("tiny", 4, seed=0, max_tokens=None, k=3)
    assert len(prompts) == 4 and 1 <= max_tokens <= 64 - 3 - 6


def test_a_cap_that_does_not_fit_is_refused_before_any_engine_starts(monkeypatch):
    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started before the inputs were checked")

    monkeypatch.setattr("specrl.bench.rollout_bench.make_backend", no_engine)
    with pytest.raises(ValueError, match="--max-tokens 128 does not fit tiny's context"):
        run_rollout_bench(RolloutBenchConfig(model="tiny", backend="vllm", max_tokens=128))


def test_ignore_eos_times_the_same_token_count_in_both_variants():
    """At temperature 1 the variants sample different responses; with ignore_eos every row runs to
    max_tokens, so both time 16 tokens per row (tiny's answers end after ~9), and each round's ratio is
    reported. A round at batch 2 times the default 8 rows: 4 calls."""
    summary = run_rollout_bench(RolloutBenchConfig(model="tiny", proposer="ngram", batch=2, max_tokens=16, rounds=2,
                                                   hf=False, ignore_eos=True))
    assert summary["mean_response_tokens"] == summary["mean_response_tokens_spec"] == 16
    assert len(summary["speedup_per_round"]) == 2 and summary["greedy_match"]
    assert summary["calls_per_round"] == 4 and summary["rows_timed"] == 2 * 8
    # the kernels it ran and the CPU flags that chose them (no int8 self-draft here)
    assert summary["fp32_kernel"] in ("avx512", "avx2", "eager") and summary["int8_kernel"] is None
    assert "avx2" in summary["cpu_flags"] or summary["fp32_kernel"] == "eager"
    assert summary["cpu_class"] == small_gemm.cpu_class(summary["cpu_flags"])


def test_the_one_sample_exactness_z_is_centred_for_the_target_and_fails_for_a_flatter_sampler():
    """`exact_terms`' z = sum(log p + H) / sqrt(sum Var) over 256 x 4 tokens from tiny: N(0, 1) for samples drawn
    from p itself, and far below 0 for samples drawn at temperature 2 but scored at 1 (a sampler biased to less
    likely tokens, as a lossy verifier is). False-failure odds of the first check: |z| > 4, about 6e-5."""
    from specrl.backends import BackendConfig, make_backend
    from specrl.bench.exactness_bench import exact_terms
    from specrl.models.checkpoint import load_causal_lm
    from specrl.models.registry import resolve_checkpoint
    from specrl.sampling import SamplingParams

    backend = make_backend(BackendConfig(model="tiny"))
    reference = load_causal_lm(resolve_checkpoint("tiny")).eval()
    prompt = backend.tokenizer.encode("12+34=", add_special_tokens=False)

    def z(temperature: float) -> float:
        drawn = backend.generate([prompt], SamplingParams(n=256, temperature=temperature, max_tokens=4, seed=3,
                                                          ignore_eos=True))
        _, _, d, var, _ = exact_terms(reference, prompt, [c.token_ids for c in drawn.completions],
                                      SamplingParams(temperature=1.0))
        return float(d.sum() / var.sum().sqrt())

    assert abs(z(1.0)) < 4
    assert z(2.0) < -8


def test_the_exactness_bench_scores_every_variant():
    from specrl.bench.exactness_bench import POSITIONS, ExactnessBenchConfig, run_exactness_bench

    summary = run_exactness_bench(ExactnessBenchConfig(model="tiny", proposer="mtp", samples=3, max_tokens=4))
    assert set(summary["variants"]) == {"none", "adaptive", "chain k=3", "tree k=3 w=3"}
    for row in summary["variants"].values():
        assert row["tokens"] > 0 and len(row["z_per_position"]) == POSITIONS and abs(row["z"]) < 10


def test_the_verify_cost_bench_times_every_shape_and_ends_with_its_json_line(capsys):
    assert cli.main(["bench", "verify-cost", "--device", "cpu", "--models", "tiny", "--batches", "1,2", "--ks", "2",
                     "--context", "8", "--rounds", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["batch"], r["k"]) for r in summary["rows"]] == [(1, 0), (1, 2), (2, 0), (2, 2)]
    assert all(r["ms"] > 0 and r["sim_ms"] > 0 for r in summary["rows"])
    assert all(r["over_plain"] == 1.0 for r in summary["rows"] if r["k"] == 0)


def test_the_trainer_step_bench_times_packed_against_padded_and_ends_with_its_json_line(capsys):
    assert cli.main(["bench", "trainer-step", "--device", "cpu", "--model", "tiny", "--prompts", "2", "--group-size",
                     "3", "--prompt-tokens", "6", "--response-tokens", "2,5", "--rounds", "1",
                     "--padded-micro-batch", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["padded_step_s"] > 0 and summary["packed_step_s"] > 0 and summary["speedup_median"] > 0
    # 2 prompts of 6 tokens computed once each instead of 3 times; the head runs only at response positions
    assert summary["packed_tokens"] == 2 * 6 + summary["packed_head_positions"] < summary["padded_tokens"]


def test_the_rollout_bench_names_the_int8_kernel_the_self_draft_ran():
    from specrl.models.llama import int8_kernels

    summary = run_rollout_bench(RolloutBenchConfig(model="tiny", proposer="int8", batch=2, max_tokens=8, rounds=1,
                                                   hf=False, ignore_eos=True))
    assert summary["int8_kernel"] == (int8_kernels() or ("eager",))[0]


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the peers extra (pip install -e '.[peers]')")
def test_the_trl_bench_runs_one_job_under_both_frameworks_with_the_same_settings(tmp_path):
    """On a random Qwen3 checkpoint with a chat template and a user's dataset: both sides train, report their
    step time, token rates and rewards, and TRL's arguments carry the job's settings."""
    from helpers import save_chat_tokenizer, save_random_checkpoint
    from specrl.bench.trl_peer import TRLBenchConfig, run_trl_bench

    model = tmp_path / "qwen3"
    save_random_checkpoint(model, arch="qwen3", vocab=100)
    save_chat_tokenizer(model)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}=?", "answer": str(2 * i)}) + "\n" for i in range(20)))
    config = tmp_path / "job.json"
    config.write_text(json.dumps({
        "backend": {"model": str(model), "proposer": "ngram"},
        "task": {"name": "file", "path": str(data), "eval_size": 4, "reward": "numeric"},
        "rollout": {"max_tokens": 6, "prompts_per_step": 2, "temperature": 1.0},
        "grpo": {"group_size": 4}, "optim": {"lr": 1e-4}}))
    out = run_trl_bench(TRLBenchConfig(preset="tiny", config=str(config), steps=2, threads=1, trl_micro_batch=4))
    for side in ("specrl", "trl"):
        assert out[side]["step_seconds"] > 0 and out[side]["rollout_tokens_per_s"] > 0
        assert len(out[side]["reward_per_step"]) == 2
    trl = out["trl_config"]
    assert (trl["num_generations"], trl["max_completion_length"], trl["learning_rate"], trl["max_steps"]) == \
        (4, 6, 1e-4, 2)
    assert trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"] == 8
    assert out["specrl_config"]["task"]["path"] == str(data)


def test_the_forward_pass_and_self_draft_acceptance_benches_run_as_subcommands(capsys):
    assert cli.main(["bench", "forward-pass", "--model", "tiny", "--shapes", "1x1,2x3", "--rounds", "1",
                     "--context", "10"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(s["rows"], s["tokens"]) for s in summary["shapes"]] == [(1, 1), (2, 3)]
    assert all(s["fp32_fused_ms"] > 0 and s["int8_projections_ms"] > 0 for s in summary["shapes"])
    assert cli.main(["bench", "self-draft-acceptance", "--model", "tiny", "--samples", "2", "--max-tokens", "4",
                     "--kernels", "eager"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary["acceptance"]["eager"]) == {"drift 0", "drift 0.02", "drift 0.05"}
    assert all(0 < v["p10"] <= 1 and 0 < v["mean"] <= 1 for v in summary["acceptance"]["eager"].values())
    assert cli.main(["bench", "self-draft-acceptance", "--kernels", "no-such-kernel"]) == 1
    assert "kernels ['no-such-kernel'] cannot run here" in capsys.readouterr().err


def test_the_f32_gguf_for_llamacpp_holds_the_dequantised_weights_and_every_metadata_field(tmp_path):
    """`write_f32_gguf` (llama.cpp's F32 copy of the policy): each tensor equal to gguf's dequantisation of the
    source's, shapes kept, every metadata field kept but the file type (all-F32 now)."""
    import gguf
    import numpy as np

    from specrl.bench.llamacpp_peer import write_f32_gguf

    rng = np.random.default_rng(0)
    source = tmp_path / "q.gguf"
    writer = gguf.GGUFWriter(str(source), "llama")
    writer.add_block_count(2)
    writer.add_rope_freq_base(1e4)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_token_list(["<a>", "b", "c"])
    writer.add_token_types([3, 1, 1])
    writer.add_chat_template("{{ messages }}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    weights = {"blk.0.ffn_up.weight": (rng.standard_normal((6, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
               "blk.0.attn_q.weight": (rng.standard_normal((4, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1),
               "output_norm.weight": (rng.standard_normal(64).astype(np.float32), gguf.GGMLQuantizationType.F32)}
    for name, (values, kind) in weights.items():
        data = gguf.quants.quantize(values, kind)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    out = write_f32_gguf(source, tmp_path / "f32.gguf")
    before, after = gguf.GGUFReader(str(source)), gguf.GGUFReader(str(out))
    for old, new in zip(before.tensors, after.tensors, strict=True):
        assert (new.name, new.shape.tolist(), new.tensor_type) == (old.name, old.shape.tolist(), gguf.GGMLQuantizationType.F32)
        assert np.array_equal(new.data, gguf.quants.dequantize(old.data, old.tensor_type).reshape(new.data.shape))
        assert not np.array_equal(new.data, weights[new.name][0]) or old.tensor_type == gguf.GGMLQuantizationType.F32
    assert after.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32
    kept = [key for key in before.fields if not key.startswith("GGUF.") and key != "general.file_type"]
    assert len(kept) == 7 and all(after.fields[key].contents() == before.fields[key].contents() for key in kept)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed")
def test_the_llamacpp_bench_without_its_extra_says_how_to_install_it():
    from specrl.bench.llamacpp_peer import LlamaCppBenchConfig, run_llamacpp_bench

    with pytest.raises(ValueError, match=r"needs llama-cpp-python.*pip install -e '\.\[llamacpp\]'"):
        run_llamacpp_bench(LlamaCppBenchConfig(rounds=1))


def test_the_grpo_bench_pools_each_sides_tokens_and_seconds_over_the_seeds():
    from specrl.bench.grpo_bench import pooled_ratio

    spec = [{"rollout_tokens": 100, "rollout_generation_s": 1.0}, {"rollout_tokens": 300, "rollout_generation_s": 2.0}]
    plain = [{"rollout_tokens": 200, "rollout_generation_s": 2.0}, {"rollout_tokens": 200, "rollout_generation_s": 2.0}]
    # 400 tokens in 3 s against 400 in 4 s; the per-seed ratios (1.0 and 1.5) have another mean
    assert pooled_ratio(spec, plain) == pytest.approx(4 / 3)


def test_the_grpo_bench_runs_both_sides_of_each_seed_and_ends_with_its_json_line(capsys):
    assert cli.main(["bench", "grpo", "--preset", "tiny", "--proposer", "ngram", "--steps", "1", "--seeds", "1",
                     "--first-seed", "3", "--threads", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["seeds"] == [3]
    plain_rate = summary["tokens"]["none"][0] / summary["generation_s"]["none"][0]
    spec_rate = summary["tokens"]["ngram"][0] / summary["generation_s"]["ngram"][0]
    assert summary["tokens_per_s"]["none"][0] == pytest.approx(plain_rate)
    assert summary["pooled_ratio"] == pytest.approx(spec_rate / plain_rate)
    seconds = summary["generation_s"]
    assert summary["seconds_ratio"] == pytest.approx(seconds["none"][0] / seconds["ngram"][0])
    assert summary["ratio_per_seed"] == [pytest.approx(summary["pooled_ratio"])]  # one seed: the same figure
    assert sum(summary["plan_reasons"][0].values()) > 0  # the speculative run's planner chose its steps
