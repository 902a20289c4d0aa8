"""argparse for the command lines with subcommands: an unknown flag after a subcommand is reported with that
subcommand's usage (argparse's own reports it with the top-level usage, which lists no flags)."""

from __future__ import annotations

import argparse

__all__ = ["parse_args"]


def parse_args(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """parser.parse_args(argv), except that arguments no parser knows are an error of the subcommand's parser
    (its usage line, exit status 2)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, sub.dest, None) if sub is not None else None
        target = sub.choices.get(chosen, parser) if sub is not None and chosen is not None else parser
        target.error(f"unrecognized arguments: {' '.join(extra)}")
    return args
