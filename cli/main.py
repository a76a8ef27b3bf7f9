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
import re
import sys
from collections.abc import Sequence
from typing import Any

import rankwatch

COMMANDS = (
    "serve",
    "status",
    "stacks",
    "policy",
    "importing",
    "export",
    "demo",
    "relay",
    "keys",
    "completion",
)
# Descriptions reuse module docstrings, whose ``code`` markup means nothing at a terminal.
_MARKUP = re.compile(r"``?([^`]+)``?")


class PlainFormatter(argparse.HelpFormatter):
    """Help in plain words: the markup goes before the text is wrapped."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(_MARKUP.sub(r"\1", text))

    def _expand_help(self, action: argparse.Action) -> str:
        return _MARKUP.sub(r"\1", super()._expand_help(action))


class PlainParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", PlainFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = PlainParser(
        prog="rankwatch",
        description="Live cross-rank monitor for distributed training (MindSpore, PyTorch).",
    )
    parser.add_argument("--version", action="version", version=f"rankwatch {rankwatch.__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)"
    )
    # Not required here: main() says what is missing after it has named any unknown flag.
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=PlainParser)
    for name in COMMANDS:
        module = importlib.import_module(f"rankwatch.cli.{name}")
        module.add_parser(subparsers)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's name and its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args, unknown = parser.parse_known_args(argv)
    commands = subcommands(parser)
    where = commands.get(args.command, parser) if args.command else parser
    if unknown:
        what = "option" if unknown[0].startswith("-") else "argument"
        more = f" (and {' '.join(unknown[1:])})" if unknown[1:] else ""
        where.error(f"unknown {what} {unknown[0]}{more} (see {where.prog} --help)")
    if args.command is None:
        parser.error(f"a COMMAND is missing, one of: {', '.join(commands)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv)
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
