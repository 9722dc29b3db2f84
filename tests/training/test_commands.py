"""`specrl pretrain` and `specrl train-draft`: parsers, summaries, and refusals."""
import argparse

import pytest

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
