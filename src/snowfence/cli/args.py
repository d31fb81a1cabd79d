"""What every command reads off its command line: the parser (one-line errors, exit status 2
for a command line it cannot read, 78 for a value it refuses), number types, the settings'
flags read into a ``Config``, the flags of a command that talks to a node."""

from __future__ import annotations

import argparse
import math
import os

from .. import config as config_mod
from ..clients.core import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S
from ..errors import SnowfenceError
from ..workers.exits import Exit

DEFAULT_CONNECT = "tcp://127.0.0.1:5555"
LAYOUT_FIELDS = ("epoch", "time_bits", "region_bits", "worker_bits", "sequence_bits", "shard_bits")
ETCD_FIELDS = ("etcd", "cluster", "etcd_ca", "etcd_cert", "etcd_key", "etcd_user", "etcd_password", "etcd_timeout_s")


class Plain(SnowfenceError):
    """An error whose message says it all: printed without a code."""


#: The exit status of a command line argparse cannot read (an unknown flag or command, a
#: missing argument), as every Unix tool's. A value it reads but refuses (out of range, not one
#: of the choices) is invalid input, as a setting's is: 78 (EX_CONFIG).
EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: exit status 2 for a command line it cannot read, 78 for a value it refuses."""

    _bad_value = False

    def _get_value(self, action, arg_string):
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError:
            self._bad_value = True
            raise

    def _check_value(self, action, value):
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            # An unknown command is a command line that cannot be read; an unknown --format is a value.
            self._bad_value = not isinstance(action, argparse._SubParsersAction)
            raise

    def error(self, message: str):
        status = Exit.CONFIG if self._bad_value else EXIT_USAGE
        self.exit(status, f"{self.prog}: {message} (see {self.prog} --help)\n")


def number(kind, low=None, high=None, *, low_open=False, what="a number"):
    """An argparse type: ``kind`` (int or float), finite, within [low, high] (or (low, high])."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        if (low is not None and (value <= low if low_open else value < low)) or (high is not None and value > high):
            lo = "" if low is None else f"{'above' if low_open else 'at least'} {low:,}"
            hi = "" if high is None else f"at most {high:,}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {' and '.join(x for x in (lo, hi) if x)}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


def add_config_flags(parser: argparse.ArgumentParser, names=None, repeatable=()) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=f"TOML file of settings (env {config_mod.ENV_PREFIX}CONFIG).",
    )
    for name, f in config_mod.FIELDS.items():
        if names is not None and name not in names:
            continue
        help_text = f"{f.metadata['help']} (env {config_mod.env_name(name)}"
        default = f.default
        if not f.metadata.get("secret") and default not in ("", ()):
            help_text += f"; default {','.join(default) if isinstance(default, tuple) else default!s}"
        parser.add_argument(
            config_mod.flag_name(name),
            dest=name,
            default=argparse.SUPPRESS,
            metavar=f.metadata.get("metavar"),
            help=help_text + ")" + (" Repeat it for several clusters." if name in repeatable else ""),
            action="append" if name in repeatable else "store",
        )


def load_config(args: argparse.Namespace, names=None) -> config_mod.Config:
    return resolve_config(args)[0]


def resolve_config(args: argparse.Namespace) -> tuple[config_mod.Config, dict]:
    flags = {name: getattr(args, name) for name in config_mod.FIELDS if hasattr(args, name)}
    return config_mod.resolve(flags=flags, config_file=getattr(args, "config", None))


def connect_flags(parser: argparse.ArgumentParser, retries: bool = True, layout: bool = False) -> None:
    """The flags of a command that talks to a node. ``layout``: the command needs only the
    node's layout, and asks a node for it only when --connect is given (otherwise the layout
    flags, the environment or --config say it); see :func:`node.layout_for`."""
    parser.add_argument(
        "--connect",
        metavar="EP[,EP...]",
        default=None if layout else os.environ.get("SNOWFENCE_CONNECT", DEFAULT_CONNECT),
        help=(
            "Take the layout from this node (broker endpoints, tried in turn) rather than from the layout flags."
            if layout
            else f"Broker endpoint(s), tried in turn (env SNOWFENCE_CONNECT; default {DEFAULT_CONNECT})."
        ),
    )
    parser.add_argument(
        "--no-discover",
        dest="discover",
        action="store_false",
        help="Use only the --connect endpoints; by default the cluster's other nodes are learned from them.",
    )
    parser.add_argument(
        "--timeout",
        type=number(float, 0, 1_000_000, low_open=True, what="a number of seconds"),
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="Seconds to wait for the reply to each attempt (default 5): the timeout is per attempt, not per call."
        + (" After a timeout the next attempt goes to another node, if one is known." if retries else ""),
    )
    if retries:
        parser.add_argument(
            "--retries",
            type=number(int, 0, 1_000_000, what="a count"),
            default=DEFAULT_RETRIES,
            metavar="N",
            help=f"Failed attempts a call retries before it gives up (default {DEFAULT_RETRIES}). A timeout that "
            "moves the call to a node it has not yet found unresponsive uses up no retry, so a call that gets "
            "no reply gives up after about (nodes known + N) x S seconds, and says how long it waited.",
        )
        parser.add_argument(
            "--retry-for",
            dest="retry_for",
            type=number(float, 0, 1_000_000, low_open=True, what="a number of seconds"),
            default=None,
            metavar="S",
            help="Retry for up to S seconds instead of --retries times, also while no node answers or "
            "accepts a connection yet: for a script that starts the node, then this command.",
        )
    parser.add_argument(
        "--server-key",
        metavar="FILE",
        default=os.environ.get("SNOWFENCE_SERVER_KEY"),
        help="The broker's public key certificate, for CURVE (env SNOWFENCE_SERVER_KEY).",
    )
    parser.add_argument(
        "--client-key",
        metavar="FILE",
        default=os.environ.get("SNOWFENCE_CLIENT_KEY"),
        help="This client's secret key certificate, when the broker has an allow-list (env SNOWFENCE_CLIENT_KEY).",
    )
