"""``snowfence verify``: its flags and checks are :mod:`snowfence.verify`'s."""

from __future__ import annotations

import argparse

from .. import verify
from . import node
from .args import LAYOUT_FIELDS, add_config_flags, connect_flags


def add(sub) -> None:
    check_ids = sub.add_parser(
        "verify",
        help="Check a dump of IDs: duplicates, IDs not valid for the layout, order within a worker ID.",
        description=verify.DESCRIPTION,
    )
    verify.add_arguments(check_ids)
    connect_flags(check_ids, layout=True)
    add_config_flags(check_ids, LAYOUT_FIELDS)
    check_ids.set_defaults(run=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    return verify.run(args, node.layout_for(args))
