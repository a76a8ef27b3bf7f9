"""The `rankwatch` console script.

Each subcommand is a small module of this package with ``NAME``, ``HELP``,
``add_parser(subparsers)`` (which sets ``func``) and ``run(args) -> int``; adding one is one
line in ``COMMANDS``. Modules import their heavy dependencies inside ``run`` so that
``rankwatch status`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import rankwatch

COMMANDS = (
    "serve",
    "status",
    "importing",
    "export",
    "demo",
    "relay",
    "keys",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankwatch",
        description="Live cross-rank monitor for distributed training (MindSpore, PyTorch).",
    )
    parser.add_argument("--version", action="version", version=f"rankwatch {rankwatch.__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"rankwatch.cli.{name}")
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    # rankwatch's own INFO lines (resend requests, store recovered) are worth seeing; other
    # libraries' only with -v.
    levels = {0: logging.WARNING, 1: logging.INFO}
    logging.basicConfig(level=levels.get(args.verbose, logging.DEBUG), format="%(message)s")
    logging.getLogger("rankwatch").setLevel(min(logging.INFO, levels.get(args.verbose, 0)))
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
