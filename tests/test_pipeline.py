"""The sync GRPO pipeline on the tiny model.

Chain of invariants:
    rollout logprobs            == the trainer's logprobs of the same tokens (<= 1e-4);
    engine after weight sync    == the trainer's updated policy (logprobs, <= 1e-4);
    resumed run                 == uninterrupted run of the same seed, step for step;
    drafter-invariant run       == the plain run of the same seed, rollout for rollout;
    configs                     fail at load, naming the key.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from specrl.sampling import SamplingParams
from specrl.models.registry import resolve_checkpoint
from specrl.pipeline.config import load_config
from specrl.pipeline.loop import Pipeline
from specrl.rl.padded_reference import padded_token_logprobs
from specrl.rl.sequences import train_batch

# fixed K: adaptive K reads wall-clock time, which would make the sampled tokens vary from run to run
SMALL = ["rollout.prompts_per_step=4", "grpo.group_size=4", "rollout.max_tokens=12", "run.tensorboard=false",
         "optim.lr=1e-3", "backend.adaptive=false"]


def small_config(tmp_path, *extra):
    return load_config("tiny", overrides=SMALL + [f"run.run_dir={tmp_path}"] + list(extra))


@pytest.mark.parametrize("proposer", [["backend.proposer=draft"],
                                      ["backend.proposer=eagle3", "draft.enabled=false"],
                                      ["backend.proposer=hybrid", "backend.hybrid_model=mtp", "draft.enabled=false"],
                                      ["backend.proposer=int8"]],
                         ids=["draft", "eagle3", "hybrid-mtp", "int8"])
def test_rollout_logprobs_match_the_trainer_during_training(tmp_path, proposer):
    pipeline = Pipeline(small_config(tmp_path, "run.steps=2", *proposer))
    summary = pipeline.run()
    for record in pipeline.history:
        assert record["train"]["logprob_abs_error_max"] < 1e-4
    assert summary["steps_run"] == 2 and summary["acceptance_length"] > 1.0
    assert summary["speculation_gain"] is None  # fixed K: no plain step measured to price the steps against


def test_a_run_reports_what_speculation_saved_its_rollouts(tmp_path):
    """The decode steps priced as plain decoding over what they took (`GenerateResult.plain_equivalent_seconds`):
    exactly 1 without a proposer; with one and adaptive K, a positive figure."""
    plain = Pipeline(small_config(tmp_path / "plain", "run.steps=1", "backend.proposer=none")).run()
    assert plain["speculation_gain"] == pytest.approx(1.0, rel=1e-12)
    adaptive = Pipeline(small_config(tmp_path / "ngram", "run.steps=1", "backend.proposer=ngram",
                                     "backend.adaptive=true")).run()
    assert adaptive["speculation_gain"] > 0


def test_a_drafter_invariant_run_samples_the_same_rollouts_with_speculation_as_without(tmp_path):
    """With rollout.drafter_invariant, a seeded run with the int8 self-draft and adaptive K (whose choices follow
    wall-clock time) samples what the plain run of the same seed samples, step by step, and its rollout logprobs
    match the trainer's."""
    histories = {}
    for proposer in ("int8", "none"):
        pipeline = Pipeline(small_config(tmp_path / proposer, "run.steps=3", f"backend.proposer={proposer}",
                                         "backend.adaptive=true", "rollout.drafter_invariant=true"))
        pipeline.run()
        histories[proposer] = pipeline.history
    for spec, plain in zip(histories["int8"], histories["none"], strict=True):
        for key in ("rollout_tokens", "reward_mean", "response_length_max", "data_positions"):
            assert spec[key] == plain[key], (spec["step"], key)
        assert spec["train"]["logprob_abs_error_max"] < 1e-4
    assert sum(record["spec"]["num_drafts"] for record in histories["int8"]) > 0  # it speculated


@pytest.mark.parametrize("truncation", [["rollout.top_p=0.7"], ["rollout.top_k=20"], ["rollout.top_k=5"]],
                         ids=["top_p=0.7", "top_k=20", "top_k=5"])
def test_truncated_sampling_is_scored_under_the_same_truncation(tmp_path, truncation):
    """The engine samples from the top-k / top-p truncated distribution and records logprobs under it;
    the pipeline must score the same tokens under the same truncation, or every ratio starts below 1
    (0.71-0.79 at top_p 0.7 before the fix) and negative-advantage tokens are clipped to no gradient."""
    pipeline = Pipeline(small_config(tmp_path, "run.steps=2", "backend.proposer=ngram", *truncation))
    pipeline.run()
    for record in pipeline.history:
        assert record["train"]["logprob_abs_error_max"] < 1e-4
    assert pipeline.history[0]["train"]["clip_fraction"] == 0.0  # ratio == 1 on the first update


def test_engine_after_weight_sync_produces_the_trainers_logprobs(tmp_path):
    pipeline = Pipeline(small_config(tmp_path, "run.steps=1"))
    pipeline.run()  # one optimiser step with lr 1e-3, then sync as version 1
    backend, tok = pipeline.source.backend, pipeline.learner.tokenizer
    prompt = pipeline.learner.task.render(pipeline.learner.task[123], tok)
    result = backend.generate([prompt], SamplingParams(max_tokens=10, seed=3))
    completion = result.completions[0]
    assert completion.versions == [1] * len(completion.token_ids)
    ids = tok.encode(prompt, add_special_tokens=False)
    batch = train_batch([ids], [completion.token_ids], pad_id=0)
    with torch.no_grad():
        lp = padded_token_logprobs(pipeline.learner.trainer.model(input_ids=batch.ids).logits, batch.ids, 1.0)
    trainer_lp = lp[0, len(ids) - 1: len(ids) - 1 + len(completion.token_ids)]
    assert torch.allclose(trainer_lp, torch.tensor(completion.logprobs), atol=1e-4)


def test_online_draft_adaptation_brings_the_draft_closer_to_a_fixed_policy(tmp_path):
    # a freshly initialised draft with tiny-draft's shape; a vanishing policy learning rate holds
    # the policy still, so any change in the draft's KL to it is the adaptation's doing
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(resolve_checkpoint("tiny-draft")))
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "fresh-draft")
    pipeline = Pipeline(small_config(tmp_path / "run", "run.steps=12", "backend.proposer=draft", "draft.lr=1e-2",
                                       "optim.lr=1e-12", f"backend.draft={tmp_path / 'fresh-draft'}"))
    pipeline.run()
    kl = [r["train"]["draft_kl"] for r in pipeline.history]
    acceptance = [r["train"]["draft_expected_acceptance"] for r in pipeline.history]
    assert sum(kl[-3:]) / 3 < 0.9 * sum(kl[:3]) / 3
    assert sum(acceptance[-3:]) > sum(acceptance[:3])


def read_rewards(run_dir):
    return [json.loads(line)["reward_mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_command(run_dir, *extra):
    return [sys.executable, "-m", "specrl.cli", "train", "--preset", "tiny", *SMALL, f"run.run_dir={run_dir}", *extra]


@pytest.mark.slow
def test_killed_run_resumes_and_matches_the_uninterrupted_run(tmp_path):
    # SMALL fixes K: adaptive K would change how many random numbers a step draws (the
    # distribution stays exact, but the samples would differ between the two runs)
    steps = ["run.steps=6", "run.checkpoint_every=2", "run.threads=1"]
    reference = tmp_path / "reference"
    subprocess.run(train_command(reference, *steps), check=True, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(train_command(killed, *steps), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:  # kill once step 3 is on record: a checkpoint exists, the run is mid-way
        metrics = killed / "metrics.jsonl"
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(read_rewards(killed)) < 6, "the run finished before it could be killed"
    resumed = subprocess.run([sys.executable, "-m", "specrl.cli", "train", "--resume", str(killed)],
                             check=True, capture_output=True, text=True)
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] in (2, 4) and summary["steps_run"] == 6 - summary["resumed_from"]
    assert read_rewards(killed) == read_rewards(reference)


def test_unknown_config_key_is_named():
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['grpo.gruop_size'\]"):
        load_config("tiny", overrides=["grpo.gruop_size=4"])


def test_bad_config_value_is_named():
    for override, message in (("rollout.top_p=0", "rollout.top_p must be in \\(0, 1\\], got 0"),
                              ("rollout.top_p=1.5", "rollout.top_p must be in \\(0, 1\\], got 1.5"),
                              ("rollout.temperature=NaN", "rollout.temperature must be a finite number"),
                              ("rollout.top_k=-3", "rollout.top_k must be >= 0"),
                              ("task.size=0", "task.size must be >= 1"),
                              ("grpo.clip_low=Infinity", "grpo.clip_low must be a finite number")):
        with pytest.raises(ValueError, match=message):
            load_config("tiny", overrides=[override])
    with pytest.raises(ValueError, match="rollout.temperature must be > 0"):
        load_config("tiny", overrides=["rollout.temperature=0"])
    with pytest.raises(ValueError, match="'optim.lr' expects"):
        load_config("tiny", overrides=["optim.lr=fast"])


def test_resume_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint to resume from"):
        Pipeline(small_config(tmp_path), resume=True)


def test_online_adaptation_of_a_reduced_vocabulary_draft_is_refused_by_name(tmp_path):
    from specrl.models.checkpoint import load_state_dict
    from specrl.rl.draft_adaptation import DraftAdaptConfig, DraftTrainer
    import shutil
    from safetensors.torch import save_file

    draft = tmp_path / "reduced"
    shutil.copytree(resolve_checkpoint("tiny-draft"), draft)
    config = json.loads((draft / "config.json").read_text())
    config["draft_vocab_size"] = 8
    (draft / "config.json").write_text(json.dumps(config))
    state = load_state_dict(draft)
    state["d2t"] = torch.arange(8)
    save_file(state, str(draft / "model.safetensors"))
    with pytest.raises(ValueError, match="reduced-vocabulary drafts is not supported; set draft.enabled=false"):
        DraftTrainer(draft, DraftAdaptConfig(), temperature=1.0)


def test_a_fresh_run_refuses_to_drop_an_earlier_runs_checkpoints(tmp_path):
    Pipeline(small_config(tmp_path, "run.steps=1")).run()
    with pytest.raises(ValueError, match="already holds a run's checkpoints: continue it with --resume"):
        Pipeline(small_config(tmp_path, "run.steps=1"))
    Pipeline(small_config(tmp_path, "run.steps=1", "run.overwrite=true")).run()


def test_the_run_folder_is_checked_before_any_engine_is_built(tmp_path, monkeypatch):
    Pipeline(small_config(tmp_path, "run.steps=1")).run()

    def no_backend(*args, **kwargs):
        raise AssertionError("the backend was built before the run folder was checked")

    monkeypatch.setattr("specrl.pipeline.actors.make_backend", no_backend)
    with pytest.raises(ValueError, match="already holds a run's checkpoints"):
        Pipeline(small_config(tmp_path, "run.steps=1"))


def test_resume_continues_the_run_in_the_folder_it_names_after_a_move(tmp_path):
    """The saved config names the folder the run started in; --resume RUN_DIR wins, so a moved run
    resumes where it now is and the old path is never recreated."""
    from specrl import cli

    first = tmp_path / "first"
    Pipeline(small_config(first, "run.steps=2", "run.checkpoint_every=1")).run()
    moved = tmp_path / "moved"
    first.rename(moved)
    assert cli.main(["train", "--resume", str(moved), "run.steps=3"]) == 0
    steps = [json.loads(line)["step"] for line in (moved / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3] and not first.exists()
    assert json.loads((moved / "config.json").read_text())["run"]["run_dir"] == str(moved)


def test_overrides_are_accepted_anywhere_on_the_command_line(tmp_path):
    from specrl import cli

    args = cli.parse(cli.build_parser(), ["train", "--preset", "tiny", "run.steps=4", "--pipeline", "async",
                                          "pipeline.max_staleness=1", "--proposer", "ngram", "grpo.group_size=4"])
    assert args.overrides == ["run.steps=4", "pipeline.max_staleness=1", "grpo.group_size=4"]
    assert (args.pipeline, args.proposer) == ("async", "ngram")
    with pytest.raises(SystemExit):
        cli.parse(cli.build_parser(), ["train", "--no-such-flag"])
