"""`specrl bench KIND`: every benchmark, one subcommand each, its flags made from its config class.

Each benchmark module holds a `BENCH` (`specrl.bench.Bench`): its config, run, report and help. A subcommand
takes `--config FILE`, one flag per config field and `key=value` overrides (`commands.config_flags`), shows a
progress bar on stderr, prints its report, and ends with one JSON line. Variants alternate within a round and
medians are reported.
"""
from __future__ import annotations

import functools
import importlib

from specrl.commands.common import console, progress_bar, set_threads
from specrl.commands.config_flags import Alias, add_config_flags, config_from_args

# subcommand -> its module, in the order `specrl bench --help` lists them
BENCH_MODULES = {
    "rollout": "specrl.bench.rollout_bench",
    "drafters": "specrl.bench.drafters_bench",
    "verification": "specrl.bench.verification_bench",
    "exactness": "specrl.bench.exactness_bench",
    "kernel": "specrl.bench.kernel_bench",
    "forward-pass": "specrl.bench.forward_pass",
    "verify-cost": "specrl.bench.verify_cost",
    "self-draft-acceptance": "specrl.bench.self_draft_acceptance",
    "trainer-step": "specrl.bench.trainer_step",
    "grpo": "specrl.bench.grpo_bench",
    "async": "specrl.bench.async_bench",
    "trl": "specrl.bench.trl_peer",
    "llamacpp": "specrl.bench.llamacpp_peer",
}

# flags kept under the names the docs have used, beside the generated ones
ALIASES = {
    "rollout": (Alias("--fixed-k", "adaptive", False, "always verify K drafts: --no-adaptive"),),
    "drafters": (Alias("--fixed-k", "adaptive", False, "always verify K drafts: --no-adaptive"),
                 Alias("--verification", "verifications", help="the same as --verifications")),
}


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks (each ends with one JSON line)",
                                  description=__doc__.split("\n\n")[1])
    kinds = bench.add_subparsers(dest="bench", metavar="KIND", required=True)
    for name, module in BENCH_MODULES.items():
        spec = importlib.import_module(module).BENCH
        parser = kinds.add_parser(name, help=spec.help, description=spec.description)
        add_config_flags(parser, spec.config, ALIASES.get(name, ()))
        parser.set_defaults(func=functools.partial(run, name, spec))


def run(name: str, spec, args) -> dict:
    config = config_from_args(spec.config, args)
    set_threads(config.threads)
    with progress_bar(f"bench {name}", spec.steps(config)) as update:
        summary = spec.run(config, progress=update)
    spec.report(summary, config, console)
    return summary
