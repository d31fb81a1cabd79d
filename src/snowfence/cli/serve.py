"""``snowfence serve``: run a node."""

from __future__ import annotations

import argparse

from .. import config as config_mod
from .args import add_config_flags, load_config


def add(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="Run a node: a broker and its worker processes.",
        description="Run a node. With no arguments: embedded mode (file locks in the "
        "state directory), region 0, one worker per core, on tcp://127.0.0.1:5555.",
    )
    add_config_flags(serve)
    serve.set_defaults(run=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ..broker import preflight

    # Before the broker's modules are imported: they import the server extra's packages,
    # which a client install (pip install snowfence) does not have.
    preflight.require_server()
    from ..broker.main import serve
    from ..logs import setup

    config = load_config(args)
    setup(config.log_level, config.log_format, role="broker")
    import logging

    from ..logs import event

    for line in config_mod.unknown_env():
        event(logging.getLogger("snowfence.broker"), "unknown_environment", line, level=logging.WARNING)
    return serve(config)
