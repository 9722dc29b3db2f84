"""The `specrl` command line: a thin layer over the library.

Each subcommand is a module of `specrl.commands` that exposes `register(subparsers)`
(adds its parser and sets `func`) and a `run(args) -> dict`. Every long command shows
progress on stderr and prints one JSON object as the last line of stdout.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

# Module paths of the subcommands, in the order `--help` lists them.
COMMAND_MODULES = (
    "specrl.commands.demo",
    "specrl.commands.train",
    "specrl.commands.eval",
    "specrl.commands.plot",
    "specrl.commands.bench",
    "specrl.commands.simulate",
    "specrl.commands.pretrain",
    "specrl.commands.train_draft",
    "specrl.commands.env",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specrl",
        description="Lossless speculative decoding for RL post-training rollouts. "
        "Every command ends with one JSON line that summarises it.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; `key=value` overrides may stand anywhere on it, before or after options
    (argparse alone would take only those before the first option into a command's `overrides`)."""
    args, extra = parser.parse_known_args(argv)
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    if overrides and hasattr(args, "overrides"):
        args.overrides = [*args.overrides, *overrides]
        extra = [item for item in extra if item not in overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        summary = args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"specrl {args.command}: error: {err}", file=sys.stderr)
        return 1
    if summary is not None:
        print(json.dumps(summary, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
