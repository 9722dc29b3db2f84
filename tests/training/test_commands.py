"""`specrl pretrain` and `specrl train-draft`: parsers, summaries, and refusals."""
import argparse

import pytest
import torch

from specrl.commands import pretrain, train_draft


@pytest.fixture()
def parser():
    p = argparse.ArgumentParser(prog="specrl")
    subparsers = p.add_subparsers(dest="command")
    pretrain.register(subparsers)
    train_draft.register(subparsers)
    return p


@pytest.mark.slow
def test_pretrain_returns_a_summary_with_loss_accuracy_seconds_and_out(parser, tmp_path):
    args = parser.parse_args(["pretrain", "--steps", "2", "--draft-steps", "1", "--batch-size", "4", "--out", str(tmp_path)])
    summary = args.func(args)
    assert {"loss", "accuracy_greedy", "accuracy_sampled", "draft_acceptance", "seconds", "out"} <= summary.keys()
    assert summary["out"] == str(tmp_path.resolve())
    assert (tmp_path / "tiny" / "model.safetensors").is_file()
    assert (tmp_path / "tiny-draft" / "config.json").is_file()


def test_train_draft_refuses_tiny_and_says_where_its_draft_comes_from(parser):
    args = parser.parse_args(["train-draft", "--target", "tiny"])
    with pytest.raises(ValueError, match="specrl pretrain"):
        args.func(args)


def test_train_draft_needs_out_for_a_path_target(parser, tmp_path):
    args = parser.parse_args(["train-draft", "--target", str(tmp_path)])
    with pytest.raises(ValueError, match="--out is required"):
        args.func(args)


def test_bad_step_counts_name_the_field(parser, tmp_path):
    args = parser.parse_args(["pretrain", "--steps", "0", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="PretrainConfig.steps"):
        args.func(args)


TINY_HEAD = ["train-draft", "--target", "tiny", "--kind", "eagle3", "--steps", "6", "--prompts", "4",
             "--sample-batch", "2", "--held-out-prompts", "2", "--max-new-tokens", "8", "--draft-vocab", "0"]


def test_a_train_draft_run_in_chunks_resumes_to_the_head_an_unbroken_run_makes(parser, tmp_path):
    """A first sitting of 0 minutes samples the rollouts and saves the state before any step; `--resume` loads both
    and trains on: the head equals, bit for bit, the one a single sitting makes."""
    from safetensors.torch import load_file

    whole = parser.parse_args([*TINY_HEAD, "--work-dir", str(tmp_path / "a"), "--out", str(tmp_path / "head_a")])
    assert whole.func(whole)["finished"]
    first = parser.parse_args([*TINY_HEAD, "--work-dir", str(tmp_path / "b"), "--out", str(tmp_path / "head_b"),
                               "--sitting-minutes", "0"])
    stopped = first.func(first)
    assert not stopped["finished"] and stopped["resume"] == f"specrl train-draft --resume {tmp_path / 'b'}"
    assert not (tmp_path / "head_b").exists()
    assert (tmp_path / "b" / "rollouts" / "train" / "rollouts.json").is_file()
    again = parser.parse_args(["train-draft", "--resume", str(tmp_path / "b")])
    done = again.func(again)
    assert done["finished"] and done["train_steps"] == 6
    a, b = load_file(str(tmp_path / "head_a" / "model.safetensors")), load_file(str(tmp_path / "head_b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_work_folder_that_holds_a_run_is_refused_and_resume_needs_one(parser, tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "command.json").write_text("{}")
    args = parser.parse_args([*TINY_HEAD, "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="already holds a run: continue it with --resume"):
        args.func(args)
    args = parser.parse_args(["train-draft", "--resume", str(tmp_path / "nothing")])
    with pytest.raises(ValueError, match="not a train-draft work folder"):
        args.func(args)


def test_a_killed_collection_resumes_from_the_batches_it_saved(tmp_path, monkeypatch):
    """Batches land in train.partial as they are sampled; a collection killed in its second training batch and
    started again loads the first from disk, samples the rest, and ends with what an unbroken one collects."""
    from specrl.engine.engine import RolloutEngine
    from specrl.models.registry import resolve_checkpoint
    from specrl.training.rollout_data import RolloutDataConfig, sample_target

    data = RolloutDataConfig(prompts=4, sample_batch=2, held_out_prompts=2, max_new_tokens=6)
    whole = sample_target("tiny", resolve_checkpoint("tiny"), data, 0, tmp_path / "whole").train
    calls, generate = [], RolloutEngine.generate

    def killed_on_the_third_call(self, *args, **kwargs):  # held-out batch, training batch 0, then the kill
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(RolloutEngine, "generate", killed_on_the_third_call)
    with pytest.raises(KeyboardInterrupt):
        sample_target("tiny", resolve_checkpoint("tiny"), data, 0, tmp_path / "killed")
    assert sorted(p.name for p in (tmp_path / "killed" / "train.partial").iterdir()) == ["batch_00000"]
    monkeypatch.setattr(RolloutEngine, "generate", generate)
    resumed = sample_target("tiny", resolve_checkpoint("tiny"), data, 0, tmp_path / "killed").train
    assert len(resumed) == len(whole) == 4
    assert all(torch.equal(a, b) for a, b in zip(resumed.ids, whole.ids))
    assert all(torch.equal(a[-1], b[-1]) for a, b in zip(resumed.features, whole.features))
    assert not (tmp_path / "killed" / "train.partial").exists()  # the whole collection replaced the batches
