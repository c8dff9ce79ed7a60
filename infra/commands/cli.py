"""`ftstack`: one console entry; each subcommand lives in ``infra/commands/<name>.py`` and
registers itself with ``register(subparsers)`` (parser plus ``func`` default).

A call that names its subcommand imports that module only: the others pull in the Pulumi program, matplotlib
and botocore, about two of the three seconds a call took here."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS = ("plan", "bootstrap_backend", "runs", "report", "run", "status")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of `only` (a module name of COMMANDS)."""
    parser = argparse.ArgumentParser(
        prog="ftstack", description="Soperator fine-tuning stacks: offline plan, pipeline runs, reports."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"infra.commands.{name}").register(subparsers)
    return parser


def named_command(argv: Sequence[str]) -> str | None:
    """The module of the subcommand `argv` starts with, if it starts with one."""
    module = argv[0].replace("-", "_") if argv else ""
    return module if module in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(named_command(argv)).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
