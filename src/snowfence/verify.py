"""``snowfence verify``: check a dump of IDs (to be written)."""

from __future__ import annotations

import argparse

DESCRIPTION = "Check a dump of IDs."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="*", metavar="FILE")


def run(args: argparse.Namespace, layout) -> int:
    raise NotImplementedError
