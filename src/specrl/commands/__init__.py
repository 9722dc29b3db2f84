"""CLI subcommands, one module each: register(subparsers) + a run function."""
