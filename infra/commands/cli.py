"""`ftstack`: one console entry; each subcommand lives in ``infra/commands/<name>.py`` and
registers itself with ``register(subparsers)`` (parser plus ``func`` default)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

COMMANDS = ("plan", "bootstrap_backend", "runs", "report", "run", "status")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftstack", description="Soperator fine-tuning stacks: offline plan, pipeline runs, reports."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"infra.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
