"""`specrl bench` flags are made from the benches' config classes: one flag per field with the field's comment as
its help, `--config FILE`, then the flags, then `key=value` overrides; the flags the docs used before keep working;
a bad value is refused naming the flag or key."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from specrl.bench.drafters_bench import DraftersBenchConfig
from specrl.bench.rollout_bench import RolloutBenchConfig
from specrl.cli import build_parser, parse
from specrl.commands.bench import BENCH_MODULES
from specrl.commands.config_flags import config_from_args
from specrl.pipeline.config_reference import field_comments


def bench_args(*argv: str) -> argparse.Namespace:
    return parse(build_parser(), ["bench", *argv])


def config(cls, *argv: str):
    return config_from_args(cls, bench_args(*argv))


def bench_parsers() -> dict[str, argparse.ArgumentParser]:
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    return dict(bench._subparsers._group_actions[0].choices)


def test_every_bench_is_a_subcommand_and_every_field_a_flag_with_its_comment_as_help():
    parsers = bench_parsers()
    assert set(parsers) == set(BENCH_MODULES)
    for name, parser in parsers.items():
        spec = parser.get_default("func").args[1]
        flags = {s for action in parser._actions for s in action.option_strings}
        comments = field_comments(spec.config)
        for f in dataclasses.fields(spec.config):
            assert "--" + f.name.replace("_", "-") in flags, f"bench {name}: no flag for {f.name}"
        assert "--config" in flags
        assert "threads" in comments, f"bench {name}: its config has no commented threads field"
    help_text = parsers["rollout"].format_help()
    assert "--max-tokens MAX_TOKENS" in help_text and "response cap" in help_text and "type: ignore" not in help_text


def test_flags_build_the_config_with_types_tuples_switches_and_none():
    c = config(RolloutBenchConfig, "rollout", "--model", "tiny", "--batch", "2", "--k", "none", "--temperature", "0.5",
               "--no-hf", "--ignore-eos", "--verification", "token")
    assert (c.model, c.batch, c.k, c.temperature, c.hf, c.ignore_eos, c.verification) == \
        ("tiny", 2, None, 0.5, False, True, "token")
    d = config(DraftersBenchConfig, "drafters", "--proposers", "ngram,int8", "--batches", "1,8")
    assert d.proposers == ("ngram", "int8") and d.batches == (1, 8)


def test_the_flags_the_docs_used_before_keep_working():
    assert config(RolloutBenchConfig, "rollout", "--fixed-k").adaptive is False
    d = config(DraftersBenchConfig, "drafters", "--verification", "block,token", "--fixed-k")
    assert d.verifications == ("block", "token") and d.adaptive is False


def test_config_file_then_flags_then_key_value_overrides(tmp_path):
    file = tmp_path / "bench.json"
    file.write_text(json.dumps({"batch": 8, "n": 2, "rounds": 9, "proposer": "ngram"}))
    c = config(RolloutBenchConfig, "rollout", "--config", str(file), "--rounds", "5", "rounds=7", "--n", "4")
    assert (c.batch, c.n, c.rounds, c.proposer) == (8, 4, 7, "ngram")


def test_bad_values_are_refused_naming_the_flag_or_the_key(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_args("rollout", "--batch", "two")
    assert "--batch takes an integer, got 'two'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_args("drafters", "--batches", "1,x")
    assert "--batches takes comma-separated integers, got '1,x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_args("rollout", "--proposer", "nothing")
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown config key.*'batchh'"):
        config(RolloutBenchConfig, "rollout", "batchh=3")
    with pytest.raises(ValueError, match="bench rollout.batch must be >= 1, got 0"):
        config(RolloutBenchConfig, "rollout", "--batch", "0")
    with pytest.raises(ValueError, match="expects"):
        config(RolloutBenchConfig, "rollout", "batch=\"x\"")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        config(RolloutBenchConfig, "rollout", "--config", str(bad))


def test_a_field_named_config_takes_the_flag_as_the_jobs_config_file():
    from specrl.bench.trl_peer import TRLBenchConfig

    assert config(TRLBenchConfig, "trl", "--config", "job.json", "--steps", "2").config == "job.json"
