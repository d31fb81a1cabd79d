"""The ``snowfence`` command: turns arguments into config and calls the package.

snowfence serve [--bind EP] [--workers N] [--region R] [--state-dir DIR] [--config FILE] ...
snowfence check-config [the flags of serve] [--json]
snowfence reserve N [--connect EP[,EP...]] [--format text|json|binary|blocks|uuid|base32]
snowfence decode [ID... | UUID... | BASE32... | -] [--json] [--connect EP | --check]
snowfence id-at TIME [END] [--closed] [--json] [--connect EP]
snowfence status [--connect EP[,EP...]] [--json]
snowfence bench [--connect EP] [--duration S] [--batch N] [--clients C] [--depth D] [--rate R] [--json]

Exit status: 0 done; 1 the service answered with an error, or did not answer;
2 the command line cannot be read (an unknown flag or command, a missing
argument); 73 the state directory is unusable (keygen: the key files exist);
78 (EX_CONFIG) a value, a setting, the environment or the config file is invalid,
including a key file or an endpoint that cannot be used; 130 interrupted.
Every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import array
import math
import os
import re
import sys
import time

import orjson

from . import __version__, verify
from . import config as config_mod
from .clients.core import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S
from .clients.core.blocks import MAX_RESERVE
from .errors import ConfigError, EtcdUnavailable, HandshakeRefused, SnowfenceError, StateDirError
from .etcd.keys import REGION_CLAIMS
from .ids import BASE32_WIDTH, format_unix_ms, from_base32, to_base32
from .protocol import MAX_BLOCK, endpoint_problem, with_scheme
from .workers.exits import Exit

DEFAULT_CONNECT = "tcp://127.0.0.1:5555"
#: More IDs than any layout holds (its widths sum to 63 bits).
MAX_COUNT = (1 << 63) - 1
#: What separates IDs read from stdin: whitespace, or the commas, brackets and quotes of a JSON array.
ID_SEPARATORS = re.compile(r'[\s,\[\]"]+')
LAYOUT_FIELDS = ("epoch", "time_bits", "region_bits", "worker_bits", "sequence_bits", "shard_bits")
ETCD_FIELDS = ("etcd", "cluster", "etcd_ca", "etcd_cert", "etcd_key", "etcd_user", "etcd_password", "etcd_timeout_s")


class _Plain(SnowfenceError):
    """An error whose message says it all: printed without a code."""


#: The exit status of a command line argparse cannot read (an unknown flag or command, a
#: missing argument), as every Unix tool's. A value it reads but refuses (out of range, not one
#: of the choices) is invalid input, as a setting's is: 78 (EX_CONFIG).
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
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


def _number(kind, low=None, high=None, *, low_open=False, what="a number"):
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


def _add_config_flags(parser: argparse.ArgumentParser, names=None, repeatable=()) -> None:
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


def _load_config(args: argparse.Namespace, names=None) -> config_mod.Config:
    return _resolve_config(args)[0]


def _resolve_config(args: argparse.Namespace) -> tuple[config_mod.Config, dict]:
    flags = {name: getattr(args, name) for name in config_mod.FIELDS if hasattr(args, name)}
    return config_mod.resolve(flags=flags, config_file=getattr(args, "config", None))


def _connect_arg(parser: argparse.ArgumentParser, retries: bool = True, layout: bool = False) -> None:
    """The flags of a command that talks to a node. ``layout``: the command needs only the
    node's layout, and asks a node for it only when --connect is given (otherwise the layout
    flags, the environment or --config say it); see :func:`_layout_for`."""
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
        type=_number(float, 0, 1_000_000, low_open=True, what="a number of seconds"),
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="Seconds to wait for the reply to each attempt (default 5): the timeout is per attempt, not per call."
        + (" After a timeout the next attempt goes to another node, if one is known." if retries else ""),
    )
    if retries:
        parser.add_argument(
            "--retries",
            type=_number(int, 0, 1_000_000, what="a count"),
            default=DEFAULT_RETRIES,
            metavar="N",
            help=f"Failed attempts a call retries before it gives up (default {DEFAULT_RETRIES}). A timeout that "
            "moves the call to a node it has not yet found unresponsive uses up no retry, so a call that gets "
            "no reply gives up after about (nodes known + N) x S seconds, and says how long it waited.",
        )
        parser.add_argument(
            "--retry-for",
            dest="retry_for",
            type=_number(float, 0, 1_000_000, low_open=True, what="a number of seconds"),
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snowfence", description="64-bit, time-ordered IDs that are never issued twice.")
    parser.add_argument("-V", "--version", action="version", version=f"snowfence {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="Run a node: a broker and its worker processes.",
        description="Run a node. With no arguments: embedded mode (file locks in the "
        "state directory), region 0, one worker per core, on tcp://127.0.0.1:5555.",
    )
    _add_config_flags(serve)

    check = sub.add_parser(
        "check-config",
        help="Show the settings serve would run with, and where each came from; bind and write nothing.",
        description="Resolve the settings as `snowfence serve` would (defaults < --config file < SNOWFENCE_* "
        "environment < flags), check them as serve does before it binds anything, and print each with its "
        "source. Secrets are masked. Exit status 0 if serve would start, 78 or 73 (and one line saying why) if not.",
    )
    _add_config_flags(check)
    check.add_argument("--json", action="store_true", help="Print the settings as JSON.")

    reserve = sub.add_parser("reserve", help="Reserve N IDs and print them.")
    reserve.add_argument(
        "count",
        type=_number(int, 1, MAX_COUNT, what="a count"),
        metavar="N",
        help="IDs to reserve (at most 2^63-1: every ID a layout holds).",
    )
    _connect_arg(reserve)
    reserve.add_argument(
        "--format",
        choices=["text", "json", "binary", "blocks", "uuid", "base32"],
        default="text",
        help="text: one ID per line; json: one array of IDs as strings; binary: raw little-endian int64; "
        "blocks: 'first count' per line; uuid: the RFC 9562 UUIDv7 of each ID (in the node's layout), one per "
        "line; base32: 13 Crockford base32 characters per ID, one per line. Output streams as IDs arrive.",
    )
    reserve.add_argument("--json", dest="format", action="store_const", const="json", help="Same as --format json.")
    reserve.add_argument(
        "--after",
        type=_number(int, 0, (1 << 63) - 1, what="an ID"),
        metavar="ID",
        help="A causal token: every ID printed sorts after this one, wherever it came from.",
    )
    reserve.add_argument(
        "--chunk",
        type=_number(int, 1, MAX_RESERVE, what="a count"),
        default=1_000_000,
        metavar="N",
        help="IDs reserved per round while streaming (default 1,000,000).",
    )

    decode = sub.add_parser(
        "decode",
        help="Show the fields of IDs.",
        description="Decode IDs with the configured layout (flags, env or --config).",
    )
    decode.add_argument(
        "ids",
        nargs="*",
        metavar="ID",
        help="IDs to decode, in decimal, as UUIDv7s (8-4-4-4-12 or 32 hex digits) or in base32 (13 Crockford "
        "characters; all digits is read as decimal), as `snowfence reserve --format text|uuid|base32` prints them; "
        "none, or -, reads them from stdin (whitespace-separated, or a JSON array of strings).",
    )
    decode.add_argument("--json", action="store_true", help="One JSON object per line.")
    decode.add_argument(
        "--check",
        action="store_true",
        help="Flag IDs that cannot be valid for the layout: a millisecond more than a day past this host's clock, "
        "or shard bits other than the (region, worker) hash gives. Flagged IDs are still printed, marked (text) "
        "or with their flags (JSON), and make the exit status 1. On by default with --connect.",
    )
    _connect_arg(decode, layout=True)
    _add_config_flags(decode, LAYOUT_FIELDS)

    id_at = sub.add_parser(
        "id-at",
        help="Print the first and last ID that can carry a time or a range of time, per shard.",
        description="The lowest and highest ID that can carry TIME (one millisecond), or the range from TIME up "
        "to END (END excluded, unless --closed): one line per shard, 'first last', for a query such as "
        "`WHERE id BETWEEN first AND last`. With shard bits the shard sits above the timestamp, so a time is "
        "one range per shard (OR them). The layout is the node's with --connect, else the layout flags, the "
        "environment or --config. A time before the epoch or past the layout's last millisecond is refused.",
    )
    id_at.add_argument(
        "time", metavar="TIME", help="Unix milliseconds or ISO-8601 (e.g. 2026-03-01T12:00:00Z; no offset: UTC)."
    )
    id_at.add_argument("end", nargs="?", metavar="END", help="End of the range, excluded (--closed: included).")
    id_at.add_argument("--closed", action="store_true", help="Include END's millisecond in the range.")
    id_at.add_argument("--json", action="store_true", help="One JSON object per shard, per line; IDs as strings.")
    _connect_arg(id_at, layout=True)
    _add_config_flags(id_at, LAYOUT_FIELDS)

    mark = sub.add_parser(
        "watermark",
        help="Print the cluster's watermark: no ID of an earlier millisecond is minted after it is answered.",
        description="Ask a node for the cluster's watermark W: a promise that no ID carrying a millisecond before "
        "W is minted, by any node of the cluster, after the reply. Prints W's time, its Unix milliseconds, the "
        "lowest ID of that millisecond (per shard, with shard bits) and how far W is behind this host's clock. "
        "Exit status 1 while the node has promised none yet (it is starting, or its store is away).",
    )
    mark.add_argument("--json", action="store_true", help="Print one JSON object (IDs as strings).")
    _connect_arg(mark)

    bench = sub.add_parser("bench", help="Load a running deployment and report IDs/s, requests/s and latency.")
    _connect_arg(bench, retries=False)
    seconds = _number(float, 0, 1_000_000, low_open=True, what="a number of seconds")
    bench.add_argument("--duration", type=seconds, default=10.0, metavar="S", help="Seconds measured (default 10).")
    bench.add_argument(
        "--warmup",
        type=_number(float, 0, 1_000_000, what="a number of seconds"),
        default=1.0,
        metavar="S",
        help="Seconds before measuring (default 1).",
    )
    bench.add_argument(
        "--batch",
        type=_number(int, 1, MAX_BLOCK, what="a count"),
        default=4096,
        metavar="N",
        help="IDs per request (default 4096).",
    )
    bench.add_argument(
        "--clients",
        type=_number(int, 1, 256, what="a count"),
        default=4,
        metavar="C",
        help="Client processes (default 4).",
    )
    bench.add_argument(
        "--depth",
        type=_number(int, 1, 65536, what="a count"),
        default=16,
        metavar="D",
        help="Requests in flight per client (default 16).",
    )
    bench.add_argument(
        "--rate",
        type=_number(float, 0, 1e9, low_open=True, what="a rate"),
        default=0.0,
        metavar="R",
        help="Offered requests/s in total, on a fixed schedule, above 0; without it, as fast as answered.",
    )
    bench.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="Skip the uniqueness and time-window check of every ID received.",
    )
    bench.add_argument("--json", action="store_true", help="Print the results as JSON.")
    bench.add_argument(
        "--plot", metavar="FILE.png", help="Plot latency distribution and throughput (needs matplotlib)."
    )

    keygen = sub.add_parser("keygen", help="Write a CURVE key pair: NAME.key (public) and NAME.key_secret.")
    keygen.add_argument("name", metavar="NAME")
    keygen.add_argument("--dir", default=".", help="Directory to write into (default: the current one).")
    keygen.add_argument(
        "--force",
        action="store_true",
        help="Replace a key pair of that name (clients holding its public key are locked out until given the new one).",
    )

    status = sub.add_parser(
        "status",
        help="Show a node's workers: worker ID, state, lease, reservation.",
        description="Ask a node (--connect) about its workers, or with --etcd read the cluster from etcd: its "
        "nodes (endpoint, region, worker IDs, rotation, clock offsets), every worker ID held (owner, lease, mark) "
        "or retired (mark). Repeat --etcd URLS --cluster NAME to see several clusters side by side, with any region "
        "number two of them use flagged.",
    )
    _connect_arg(status)
    for action in status._actions:
        if action.dest == "connect":
            # None unless given: a --connect on the command line asks that node, whatever
            # SNOWFENCE_ETCD says (cmd_status reads SNOWFENCE_CONNECT and the default then).
            action.default = None
            action.help += " Given, it is the node's view, even with SNOWFENCE_ETCD set."
    status.add_argument("--json", action="store_true", help="Print the status as JSON.")
    _add_config_flags(status, (*LAYOUT_FIELDS, *ETCD_FIELDS), repeatable=("etcd", "cluster"))

    accept = sub.add_parser(
        "accept-restore",
        help="Accept a store that went back (restored from a backup, its keys or files deleted), once.",
        description="Nodes refuse to claim worker IDs from a store that forgot or went back on what their "
        "journals saw (`snowfence status` says what). If that was done on purpose, say so here, once, with the "
        "settings the nodes use (--etcd/--cluster, or --state-dir, and the layout): the store gets a new restore "
        "record, every claim of it waits out a quarantine (the longest reservation window plus the clock-skew "
        "bound), and the nodes take it at their next claim, keeping their journals' floors. It is no setting: a "
        "later restore needs another acceptance.",
    )
    accept.add_argument("--reason", required=True, metavar="TEXT", help="Why: recorded with the acceptance.")
    accept.add_argument(
        "--dry-run",
        action="store_true",
        help="Say what it would do (whether the store went back, the quarantine it would impose) and change nothing.",
    )
    accept.add_argument(
        "--force",
        action="store_true",
        help="Accept even a store that shows no sign of going back (its layout record is there and no node, "
        "nor this host's journal, reports it went back); exit status 78 without it.",
    )
    _add_config_flags(accept)

    release = sub.add_parser(
        "release-region",
        help="Give up a retired cluster's region claims in etcd, so another cluster may use its regions.",
        description=f"Each cluster of an etcd claims its region numbers (in {REGION_CLAIMS}), so that a "
        "second cluster, a mistyped --cluster say, cannot mint in a region another cluster holds. When a cluster "
        "is retired for good, this removes its claims (--etcd/--cluster name it). Refused while any of its worker "
        "IDs is held. The next cluster to claim a region starts a new store, whose claims wait out the longest "
        "reservation window recorded for the region plus the clock-skew bound.",
    )
    _add_config_flags(release, ETCD_FIELDS)

    check_ids = sub.add_parser(
        "verify",
        help="Check a dump of IDs: duplicates, IDs not valid for the layout, order within a worker ID.",
        description=verify.DESCRIPTION,
    )
    verify.add_arguments(check_ids)
    _connect_arg(check_ids, layout=True)
    _add_config_flags(check_ids, LAYOUT_FIELDS)
    completion = sub.add_parser(
        "completion",
        help='Print a shell completion script for every command and flag: eval "$(snowfence completion bash)".',
        description="Prints a completion script made from this command line's own parser, so it lists every "
        'command and flag of this version. Bash: add `eval "$(snowfence completion bash)"` to ~/.bashrc. Zsh: '
        'add `eval "$(snowfence completion zsh)"` to ~/.zshrc after compinit (or save it as _snowfence in a '
        "directory of $fpath). Fish: `snowfence completion fish > ~/.config/fish/completions/snowfence.fish`.",
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"], help="The shell to complete in.")

    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        if args.command != "serve":  # serve logs it (cmd_serve)
            for line in config_mod.unknown_env():
                print(f"snowfence: warning: {line}", file=sys.stderr)
        return globals()[f"cmd_{args.command.replace('-', '_')}"](args)
    except StateDirError as exc:
        print(f"snowfence: {exc}", file=sys.stderr)
        return Exit.CANTCREAT
    except ConfigError as exc:
        print(f"snowfence: {exc}", file=sys.stderr)
        return Exit.CONFIG
    except _Plain as exc:
        print(f"snowfence: {exc}", file=sys.stderr)
        return 1
    except HandshakeRefused as exc:  # a setting to fix (a key, --server-key), not a node to wait for
        print(f"snowfence: {exc.code}: {exc}", file=sys.stderr)
        return Exit.CONFIG
    except SnowfenceError as exc:
        print(f"snowfence: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`); that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"snowfence: cannot use{where}: {exc.strerror or exc}", file=sys.stderr)
        return 1


def cmd_serve(args: argparse.Namespace) -> int:
    from .broker import preflight

    # Before the broker's modules are imported: they import the server extra's packages,
    # which a client install (pip install snowfence) does not have.
    preflight.require_server()
    from .broker.main import serve
    from .logs import setup

    config = _load_config(args)
    setup(config.log_level, config.log_format, role="broker")
    import logging

    from .logs import event

    for line in config_mod.unknown_env():
        event(logging.getLogger("snowfence.broker"), "unknown_environment", line, level=logging.WARNING)
    return serve(config)


def cmd_check_config(args: argparse.Namespace) -> int:
    from .broker import preflight

    config, sources = _resolve_config(args)
    preflight.check(config, create=False)
    warnings = [message for _, message in preflight.warnings(config)]
    shown = config.public()  # secrets masked
    if args.json:
        settings = {
            name: {"value": value, "source": sources[name][0], "from": sources[name][1]}
            for name, value in shown.items()
        }
        doc = {"version": __version__, "settings": settings, "warnings": warnings}
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return 0
    for message in warnings:
        print(f"snowfence: warning: {message}", file=sys.stderr)
    # TOML, so that the output can become a config file; the source of each setting as a comment.
    # A secret's mask fed back would be taken for the secret: it is shown commented out.
    lines = [
        (
            f"# {name} = (set, not shown)" if value == config_mod.MASK else f"{name} = {orjson.dumps(value).decode()}",
            _source(name, sources[name], config),
        )
        for name, value in shown.items()
    ]
    width = max(len(setting) for setting, _ in lines)
    print(f"# snowfence {__version__}: the settings `snowfence serve` would run with; nothing was bound or written")
    print("\n".join(f"{setting:<{width}}  # {source}" for setting, source in lines))
    return 0


def _source(name: str, source: tuple[str, str | None], config) -> str:
    kind, where = source
    text = kind if where is None else f"{kind} {where}"
    if name == "workers" and config.workers == 0:
        text += f": {config.worker_count} on this host"
    if name == "curve_secret_key" and config.curve_secret_key:
        text += " (a key file; the key itself is never shown)"
    return text


def _endpoints(args: argparse.Namespace) -> list[str]:
    # host:port alone is tcp://host:port, as other tools take it.
    endpoints = [with_scheme(ep.strip()) for ep in args.connect.split(",") if ep.strip()]
    if not endpoints:
        raise ConfigError("--connect needs at least one endpoint")
    for endpoint in endpoints:
        problem = endpoint_problem(endpoint)
        if problem:
            raise ConfigError(f"--connect: {problem}")
    return endpoints


def _layout_for(args: argparse.Namespace):
    """The layout a command reads IDs with: the node's (STATUS) when --connect names one,
    otherwise the configured one (flags, environment, --config)."""
    from .ids import Layout

    if args.connect is None:
        return _load_config(args).layout
    with _client(args) as client:
        return Layout.from_dict(client.status()["layout"])


def _curve_keys(args: argparse.Namespace) -> None:
    """Fail now, with the file's name, on a key the client could not use."""
    if args.server_key is None:
        if args.client_key is not None:
            raise ConfigError("--client-key needs --server-key")
        return
    from .curve import Curve

    try:
        Curve.for_client(args.server_key, args.client_key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _client(args: argparse.Namespace):
    from .clients import Client

    endpoints = _endpoints(args)
    _curve_keys(args)
    try:
        return Client(
            endpoints,
            timeout_s=args.timeout,
            retries=getattr(args, "retries", DEFAULT_RETRIES),
            retry_for_s=getattr(args, "retry_for", None),
            server_key=args.server_key,
            client_key=args.client_key,
            discover=args.discover,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def cmd_reserve(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    write = _WRITERS[args.format]
    first = True
    client = _client(args)  # bad endpoints and keys fail before anything is written
    if args.format == "json":
        out.write(b"[")
    with client:
        if args.format == "uuid":
            write = _uuid_writer(client.layout())
        left = args.count
        while left:
            blocks = client.reserve(min(left, args.chunk), after=args.after)
            for block in blocks:
                write(out, block, first)
                first = False
            left -= sum(b.count for b in blocks)
    if args.format == "json":
        out.write(b"]\n")
    out.flush()
    return 0


def _write_text(out, block, first: bool) -> None:
    out.write("\n".join(map(str, block.range())).encode() + b"\n")


def _write_json(out, block, first: bool) -> None:
    out.write((b"" if first else b",") + ",".join(f'"{i}"' for i in block.range()).encode())


def _write_binary(out, block, first: bool) -> None:
    ids = array.array("q", block.range())
    if sys.byteorder == "big":
        ids.byteswap()
    out.write(ids.tobytes())


def _write_blocks(out, block, first: bool) -> None:
    out.write(f"{block.first} {block.count}\n".encode())


def _write_base32(out, block, first: bool) -> None:
    out.write("".join(f"{to_base32(i)}\n" for i in block.range()).encode())


def _uuid_writer(layout):
    """The writer of ``--format uuid``: it needs the node's layout, asked once."""

    def write(out, block, first: bool) -> None:
        to_uuid = layout.to_uuid
        try:
            out.write("".join(f"{to_uuid(i)}\n" for i in block.range()).encode())
        except ValueError as exc:  # an ID whose time is past what a UUIDv7 carries
            raise _Plain(str(exc)) from None

    return write


_WRITERS = {
    "text": _write_text,
    "json": _write_json,
    "binary": _write_binary,
    "blocks": _write_blocks,
    "uuid": None,  # needs the layout: _uuid_writer
    "base32": _write_base32,
}
#: The text forms decode reads besides decimal: a UUID with dashes, or 32 hex digits.
UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32}")


def _decode_inputs(ids: list[str]):
    """The IDs to decode: the arguments, with ``-`` (or no argument at all) read from stdin as it comes."""
    if not ids:
        if sys.stdin is None or sys.stdin.isatty():
            raise ConfigError("decode: give IDs, or - to read them from stdin")
        ids = ["-"]
    for text in ids:
        if text != "-":
            yield text
            continue
        for line in sys.stdin:
            yield from filter(None, ID_SEPARATORS.split(line))


def cmd_decode(args: argparse.Namespace) -> int:
    layout = _layout_for(args)
    # The node's layout says which IDs it can have minted; a configured one only when asked.
    check = args.check or args.connect is not None
    now_ms = time.time_ns() // 1_000_000
    status = 0
    flagged = 0
    for text in _decode_inputs(args.ids):
        try:
            fields = layout.decompose(_read_id(text, layout))
        except ValueError as exc:
            print(f"snowfence: {exc}", file=sys.stderr)
            status = 1
            continue
        flags = _id_flags(layout, fields, now_ms) if check else []
        if flags:
            flagged += 1
            status = 1
        if args.json:
            doc = fields.to_dict(shard=bool(layout.shard_bits))
            if check:
                doc["flags"] = flags
            print(orjson.dumps(doc).decode())
        else:
            print(
                f"{fields.id}  {format_unix_ms(fields.unix_ms)}  "
                + (f"shard={fields.shard} " if layout.shard_bits else "")
                + f"region={fields.region} "
                f"worker={fields.worker} sequence={fields.sequence}"
                + (f"  INVALID: {'; '.join(flags)}" if flags else "")
            )
    if flagged:
        print(f"snowfence: {flagged} ID{'s' if flagged != 1 else ''} cannot be valid for the layout", file=sys.stderr)
    return status


def _read_id(text: str, layout) -> int:
    """An ID from decode's input, in whichever form it comes: decimal (all digits, whatever
    the length), a UUIDv7 of ``layout`` (36 characters with dashes, or 32 hex digits), or 13
    characters of base32. Raises ``ValueError`` with one line saying why not."""
    word = text.strip()
    if word.isascii() and word.isdigit():  # str.isdigit and int() take other scripts' digits too
        try:
            return int(word)  # decompose checks the range
        except ValueError:  # digits int() does not read, e.g. superscripts
            pass
    elif UUID_TEXT.fullmatch(word):
        return layout.from_uuid(word)
    elif len(word) == BASE32_WIDTH:
        return from_base32(word)
    raise ValueError(f"{text!r} is not a snowfence ID")


def _id_flags(layout, fields, now_ms: int) -> list[str]:
    """Why an ID cannot have been minted with ``layout``, if it cannot. Its time is never
    before the epoch (the bits count from it); it can be in the future, and its shard bits
    can disagree with its worker ID's."""
    flags = []
    ahead = fields.unix_ms - now_ms
    if ahead > verify.FUTURE_MARGIN_MS:
        flags.append(f"from the future ({ahead / 86_400_000:,.1f} days past this host's clock)")
    if layout.shard_bits:
        expected = layout.shard_of(fields.region, fields.worker)
        if fields.shard != expected:
            flags.append(f"shard {fields.shard}, but region {fields.region} worker {fields.worker} is shard {expected}")
    return flags


def cmd_id_at(args: argparse.Namespace) -> int:
    from .ids import unix_ms_of

    try:
        # The times first: a typo fails before a node is asked for its layout.
        start, end = (None if t is None else unix_ms_of(t) for t in (args.time, args.end))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    layout = _layout_for(args)
    try:
        ranges = layout.bounds(start, end, closed=args.closed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for r in ranges:
        if args.json:
            print(orjson.dumps(r.to_dict()).decode())
        else:
            doc = r.to_dict()
            span = doc["start"] if r.start_ms == r.end_ms else f"{doc['start']} to {doc['end']}"
            print(f"{r.first} {r.last}  " + (f"shard={r.shard} " if layout.shard_bits else "") + span)
    return 0


def cmd_watermark(args: argparse.Namespace) -> int:
    with _client(args) as client:
        mark = client.watermark()
        layout = client.layout()
    lag_ms = time.time_ns() // 1_000_000 - mark.unix_ms
    ids = mark.ids(layout)
    if args.json:
        doc = {
            "unix_ms": mark.unix_ms,
            "time": format_unix_ms(mark.unix_ms),
            "lowest": [str(i) for i in ids] if layout.shard_bits else str(ids[0]),
            "lag_ms": lag_ms,
        }
        print(orjson.dumps(doc).decode())
    else:
        lowest = " ".join(f"shard={s}:{i}" for s, i in enumerate(ids)) if layout.shard_bits else str(ids[0])
        print(f"{format_unix_ms(mark.unix_ms)}  {mark.unix_ms}  lowest={lowest}  lag={lag_ms / 1000:.3f} s")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    return verify.run(args, _layout_for(args))


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    endpoints = _endpoints(args)
    _curve_keys(args)
    if args.plot:
        bench.need_matplotlib()  # before the run, not after it
    spec = bench.BenchSpec(
        endpoints=endpoints,
        duration_s=args.duration,
        warmup_s=args.warmup,
        batch=args.batch,
        clients=args.clients,
        depth=args.depth,
        rate=args.rate,
        check=args.check,
        timeout_s=args.timeout,
        server_key=args.server_key,
        client_key=args.client_key,
        discover=args.discover,
    )
    return bench.main(spec, args.json, args.plot)


def completion_bash(parser: argparse.ArgumentParser) -> str:
    """A bash completion script for ``parser``: its commands, and each command's flags."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    top = [o for a in parser._actions for o in a.option_strings]
    cases = []
    for name, command in commands.items():
        flags = sorted({o for a in command._actions for o in a.option_strings})
        cases.append(f'        {name}) opts="{" ".join(flags)}" ;;')
    return "\n".join(
        [
            "# bash completion for snowfence, made by `snowfence completion bash`",
            "_snowfence() {",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" cmd="" opts i',
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac',
            "    done",
            '    case "$cmd" in',
            f'        "") opts="{" ".join([*commands, *top])}" ;;',
            *cases,
            '        *) opts="" ;;',
            "    esac",
            '    COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
            "}",
            "complete -o default -F _snowfence snowfence",
            "",
        ]
    )


def _commands_and_flags(parser: argparse.ArgumentParser):
    """(top-level flags, {command: (its one-line help, its flags)}) of ``parser``, as the scripts list them."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    top = [o for a in parser._actions for o in a.option_strings]
    commands = {
        name: (helps.get(name, ""), sorted({o for a in command._actions for o in a.option_strings}))
        for name, command in sub.choices.items()
    }
    return top, commands


def completion_zsh(parser: argparse.ArgumentParser) -> str:
    """A zsh completion script for ``parser``: its commands, each command's flags, files for the rest. Works
    eval'd (after compinit) and as an autoloaded ``_snowfence`` in ``$fpath``."""
    top, commands = _commands_and_flags(parser)
    cases = [f"        {name}) opts=({' '.join(flags)}) ;;" for name, (_, flags) in commands.items()]
    return "\n".join(
        [
            "#compdef snowfence",
            "# zsh completion for snowfence, made by `snowfence completion zsh`",
            "_snowfence() {",
            '    local cmd="" i',
            "    local -a opts",
            "    for ((i = 2; i < CURRENT; i++)); do",
            '        case "${words[i]}" in -*) ;; *) cmd="${words[i]}"; break ;; esac',
            "    done",
            '    case "$cmd" in',
            f'        "") opts=({" ".join([*commands, *top])}) ;;',
            *cases,
            "        *) opts=() ;;",
            "    esac",
            '    if [[ -z "$cmd" || "${words[CURRENT]}" == -* ]]; then',
            '        compadd -- "${opts[@]}"',
            "    else",
            "        _files",
            "    fi",
            "}",
            'if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then',
            '    _snowfence "$@"',
            "else",
            "    compdef _snowfence snowfence",
            "fi",
            "",
        ]
    )


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def completion_fish(parser: argparse.ArgumentParser) -> str:
    """A fish completion script for ``parser``: each command (with its help), and each command's flags."""
    top, commands = _commands_and_flags(parser)
    lines = ["# fish completion for snowfence, made by `snowfence completion fish`", "complete -c snowfence -e"]

    def flag(option: str) -> str:
        return f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"

    for option in top:
        lines.append(f"complete -c snowfence -n __fish_use_subcommand {flag(option)}")
    for name, (text, flags) in commands.items():
        described = f" -d {_fish_quote(text.rstrip('.'))}" if text else ""
        lines.append(f"complete -c snowfence -n __fish_use_subcommand -f -a {name}{described}")
        seen = _fish_quote(f"__fish_seen_subcommand_from {name}")
        lines.extend(f"complete -c snowfence -n {seen} {flag(option)}" for option in flags)
    return "\n".join(lines) + "\n"


COMPLETIONS = {"bash": completion_bash, "zsh": completion_zsh, "fish": completion_fish}


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(COMPLETIONS[args.shell](build_parser()))
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    import tempfile

    import zmq.auth

    if not args.name or args.name.startswith(".") or "/" in args.name or "\0" in args.name:
        raise ConfigError(f"key name {args.name!r} must be a plain file name (the files go in --dir)")
    if os.path.exists(args.dir) and not os.path.isdir(args.dir):
        raise ConfigError(f"--dir {args.dir} is not a directory")
    try:
        os.makedirs(args.dir, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--dir {args.dir} cannot be made: {exc.strerror or exc}") from None
    public, secret = (os.path.join(args.dir, args.name + suffix) for suffix in (".key", ".key_secret"))
    # A server key that is replaced locks out every client that has its public key.
    existing = [path for path in (public, secret) if os.path.lexists(path)]
    if existing and not args.force:
        return _keys_exist(existing)
    # Made in a private directory and moved into place whole, the secret key never
    # exists with looser permissions, and without --force nothing is overwritten.
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".keygen-") as tmp:
        made_public, made_secret = zmq.auth.create_certificates(tmp, args.name)
        os.chmod(made_secret, 0o600)
        placed = []
        for made, final in ((made_secret, secret), (made_public, public)):
            if args.force:
                os.replace(made, final)
                continue
            try:
                os.link(made, final)
            except FileExistsError:  # made by someone else since we looked
                for path in placed:
                    os.unlink(path)
                return _keys_exist([final])
            placed.append(final)
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0


def _keys_exist(paths: list[str]) -> int:
    print(
        f"snowfence: {' and '.join(paths)} already exist{'s' if len(paths) == 1 else ''}; not replacing a key "
        "pair that clients may rely on (--force replaces it)",
        file=sys.stderr,
    )
    return Exit.CANTCREAT


def cmd_status(args: argparse.Namespace) -> int:
    etcds, clusters = getattr(args, "etcd", None) or [], getattr(args, "cluster", None) or []
    if len(etcds) > 1 or len(clusters) > 1:
        if len(etcds) != len(clusters):
            raise ConfigError("give one --cluster NAME after each --etcd URLS")
        configs = []
        for urls, name in zip(etcds, clusters, strict=True):
            args.etcd, args.cluster = urls, name
            configs.append(_load_config(args))
        return _clusters_status(configs, args.json)
    connect_given = args.connect is not None
    if connect_given and etcds:
        raise ConfigError("give --connect (a node's view) or --etcd (the cluster's, read from etcd), not both")
    if not connect_given:
        args.connect = os.environ.get("SNOWFENCE_CONNECT", DEFAULT_CONNECT)
    for name in ("etcd", "cluster"):
        if getattr(args, name, None):
            setattr(args, name, getattr(args, name)[0])
    if connect_given:  # the node asked for, not the etcd the environment names
        args.etcd = ""
    config = _load_config(args)
    if config.etcd:
        return _cluster_status(config, args.json)
    if len(_endpoints(args)) > 1:
        return _nodes_status(args)
    with _client(args) as client:
        status = client.status()
    if args.json:
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
        return 0
    broker = status["broker"]
    # A server older than software_version in STATUS says only its protocol version.
    version = f"snowfence {status['software_version']}, " if status.get("software_version") else ""
    print(
        f"broker pid {broker.get('pid')} on {broker.get('bind')}: {broker.get('state')}, "
        f"{broker.get('mode')} mode, region {status.get('region')}, "
        f"{broker.get('workers_in_rotation')} of {len(broker.get('slots', []))} workers in rotation "
        f"({version}protocol {status.get('version')})"
    )
    slots = broker.get("slots", [])
    print(
        f"{sum(s.get('restarts') or 0 for s in slots)} worker restarts, "
        f"{sum(s.get('kills') or 0 for s in slots)} killed for silence; "
        f"{broker.get('connections', 0)} client connections, {broker.get('waiting', 0)} requests waiting"
    )
    print(f"fast port {_port(broker.get('fast_port'))}, HTTP port {_port(broker.get('http_port'))}")
    print(
        f"{'slot':>5} {'pid':>7} {'worker_id':>9} {'state':<13} {'rotation':<8} {'fence_in_s':>16} "
        f"{'lease_s':>7} {'reserved_until':<24} reason"
    )
    rows = [*status["workers"], *_own_rows(broker)]
    for w in rows:
        reserved = w.get("reserved_until_ms")
        reserved_text = (
            format_unix_ms(reserved + status["layout"]["epoch_ms"])
            if isinstance(reserved, int) and reserved >= 0
            else "-"
        )
        print(
            f"{w.get('slot', '-'):>5} {w.get('pid', '-'):>7} {_dash(w.get('worker_id')):>9} {str(w.get('state')):<13} "
            f"{'yes' if w.get('in_rotation') else 'no':<8} {_fence_text(w):>16} "
            f"{_dash(w.get('lease_remaining_s')):>7} {reserved_text:<24} {_row_reason(w)}"
        )
    passed = {p["worker_id"]: p["reason"] for w in status["workers"] for p in w.get("passed_over") or ()}
    for worker_id, reason in sorted(passed.items()):
        print(f"passed over worker ID {worker_id}: {reason}")
    for problem in sorted({w["store_problem"] for w in status["workers"] if w.get("store_problem")}):
        print(f"STORE WENT BACK: {problem}")
    return 0


def _port(door) -> str:
    """A door of STATUS (``broker.fast_port``, ``broker.http_port``): its port, or off."""
    return str(door["port"]) if isinstance(door, dict) and door.get("port") is not None else "off"


def _own_rows(broker: dict) -> list[dict]:
    """The broker's own worker ID as rows of the status table (slot ``own``, the broker's pid)."""
    own = broker.get("own_worker_id")
    if not isinstance(own, dict):
        return []
    base = {"slot": "own", "pid": broker.get("pid"), "in_rotation": bool(own.get("ready")), "reason": own.get("reason")}
    held = [h for h in own.get("held") or () if isinstance(h, dict)]
    if not held:
        return [{**base, "worker_id": None, "state": own.get("state")}]
    return [{**h, **base} for h in held]


def _fence_text(row: dict) -> str:
    """When the worker ID fences itself: in seconds, or how long ago it did."""
    fence = row.get("fence_in_s")
    if isinstance(fence, int | float) and (fence < 0 or row.get("state") == "fenced"):
        return f"fenced {max(-fence, 0):.1f} s ago"
    return _dash(fence)


def _row_reason(row: dict) -> str:
    """The reason of one row, about its own worker ID: a worker's reason names all it holds
    ("holding worker ID 11, 12, 13"), or one of them, or none (then it is about the process)."""
    reason = row.get("reason") or ""
    worker_id = row.get("worker_id")
    if worker_id is None or not reason:
        return reason
    if reason.startswith("holding worker ID "):
        return f"holding worker ID {worker_id}"
    lists = re.findall(r"worker IDs? ((?:\d+(?:, )?)+)", reason)
    named = {int(n) for listed in lists for n in listed.split(", ") if n}
    if named and worker_id not in named:
        return f"holding worker ID {worker_id}"
    return reason


def cmd_accept_restore(args: argparse.Namespace) -> int:
    config = _load_config(args)
    if not args.reason.strip() or not args.reason.isprintable():
        raise ConfigError("--reason must be printable text")
    from .store import open_store

    # The store as the node opens it, every setting counted; an etcd cluster's without this
    # host's journal (the command may run on any host that reaches etcd).
    store = open_store(config, journal=config.embedded)
    signs = []
    if config.embedded:
        where = f"state directory {config.state_dir}"
        if store.journal.problem:
            print(f"this host's journal had refused: {store.journal.problem}")
            signs.append(f"this host's journal refused it: {store.journal.problem}")
    else:
        where = f"cluster {config.cluster!r}"
    try:
        planned = store.accept_restore(args.reason.strip(), dry_run=True)
        if not store.found_genesis:
            signs.append("its layout record is gone")
        behind = getattr(store, "marks_behind", ())
        if behind:
            signs.append(f"the marks of worker IDs {', '.join(map(str, behind))} are below this host's journal")
        if not signs and not config.embedded:
            signs.extend(_nodes_refusing(config))
        until = format_unix_ms(planned.quarantine_until_ms + config.layout.epoch_ms)
        state = f"went back ({'; '.join(signs)})" if signs else "shows no sign of going back"
        if args.dry_run:
            print(
                f"dry run: {where} (store {planned.store_id}) {state}; accepting a restore would make claims mint "
                f"nothing until {until}; nothing was changed"
            )
            return 0
        if not signs and not args.force:
            print(
                f"snowfence: {where} shows no sign of going back (its layout record is there and no node reports it "
                f"went back): not imposing a quarantine until {until}; --force to accept a restore anyway",
                file=sys.stderr,
            )
            return Exit.CONFIG
        genesis = store.accept_restore(args.reason.strip())
    finally:
        store.close()
    until = format_unix_ms(genesis.quarantine_until_ms + config.layout.epoch_ms)
    print(
        f"accepted restore {genesis.restore.id} of {where} (store {genesis.store_id}): claims mint nothing "
        f"until {until}; nodes that refused take it at their next claim"
    )
    return 0


def _nodes_refusing(config) -> list[str]:
    """What the cluster's live nodes report of a store that went back: in their etcd entries
    (``store_problem``, which a node that takes only CURVE clients can tell), and, from a node
    whose entry says nothing (written before it found out, or by an older release), in its
    STATUS, asked once; a node that does not answer says nothing."""
    from .clients.blocking import Client

    try:
        entries = _read_etcd(config, lambda c: c.nodes())
    except SnowfenceError:
        return []
    said = []
    for entry in entries:
        if entry.get("store_problem"):
            said.append(f"node {entry.get('node')} refuses it: {entry['store_problem']}")
            continue
        if not entry.get("endpoints"):
            continue
        try:
            with Client(entry["endpoints"][0], timeout_s=2.0, retries=0, discover=False) as client:
                status = client.status()
        except (SnowfenceError, ValueError):
            continue
        for worker in status.get("workers") or ():
            if worker.get("store_problem"):
                said.append(f"node {entry['node']} refuses it: {worker['store_problem']}")
                break
    return said


def cmd_release_region(args: argparse.Namespace) -> int:
    config = _load_config(args)
    if not config.etcd:
        raise ConfigError("release-region needs --etcd and --cluster: region claims live in etcd")
    try:
        released = _read_etcd(config, lambda c: c.release_regions())
    except ConfigError:
        raise
    except SnowfenceError as exc:
        raise _Plain(str(exc)) from None
    if released:
        print(f"released the claims of cluster {config.cluster!r} on regions {', '.join(map(str, released))}")
    else:
        print(f"cluster {config.cluster!r} claims no region of this etcd")
    return 0


def _read_etcd(config, read):
    """``read(cluster)`` on the etcd cluster ``config`` names; etcd not answering is said in plain words."""
    from .etcd.cluster import Cluster

    cluster = Cluster(config)
    try:
        return read(cluster)
    except EtcdUnavailable as exc:
        detail = str(exc).split(" failed: ", 1)[-1]  # what the client said, without which call it was
        raise _Plain(
            f"cannot reach etcd at {','.join(config.etcd)}: {detail} (each call waits up to "
            f"{config.etcd_timeout_s:g} s); is etcd running there, and are the address, TLS files and password right?"
        ) from None
    finally:
        cluster.close()


def _region_claims(cluster) -> dict:
    """This etcd's region claims for status: {region: cluster}, or why they cannot be read."""
    try:
        claims = cluster.region_claims()
    except ConfigError as exc:
        return {"unreadable": str(exc)}
    return {"regions": {str(r): c.to_dict() for r, c in sorted(claims.regions.items())}, "widths": claims.widths}


def _claim_conflicts(name: str, regions: list[int], claims: dict) -> list[str]:
    """Why the regions cluster ``name``'s nodes used are not its to mint in, if they are not."""
    if "unreadable" in claims:
        return [claims["unreadable"]]
    out = []
    for region in regions:
        claim = claims["regions"].get(str(region))
        if claim is not None and claim["cluster"] != name:
            out.append(
                f"region {region}, which nodes of cluster {name!r} used, is claimed by cluster {claim['cluster']!r}: "
                "their nodes can mint the same IDs"
            )
    return out


def _cluster_status(config, as_json: bool) -> int:
    entries, members, regions, claims, known = _read_etcd(
        config, lambda c: (c.census(), c.nodes(), c.regions(), _region_claims(c), c.known())
    )
    if not (known or entries or members or regions):
        others = sorted({c["cluster"] for c in claims.get("regions", {}).values()})
        raise _Plain(
            f"cluster {config.cluster!r} is unknown to etcd at {','.join(config.etcd)}: no layout, node, region or "
            "worker ID of it is recorded there"
            + (f" (clusters with region claims there: {', '.join(others)})" if others else "")
            + "; is --cluster (or SNOWFENCE_CLUSTER) right?"
        )
    conflicts = _claim_conflicts(config.cluster, regions, claims)
    from .broker.membership import bounds_differ

    unlike = bounds_differ(members)
    epoch = config.layout.epoch_ms
    now_ms = time.time_ns() // 1_000_000 - epoch
    for e in entries:
        if e.get("mark_ms") is not None:
            e["mark_time"] = format_unix_ms(e["mark_ms"] + epoch)
            e["mark_passed"] = e["mark_ms"] < now_ms
    if as_json:
        doc = {
            "cluster": config.cluster,
            "regions": regions,
            "region_claims": claims,
            "conflicts": conflicts,
            "bounds_not_alike": unlike,
            "nodes": members,
            "worker_ids": entries,
        }
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return 1 if conflicts else 0
    print(
        f"cluster {config.cluster!r}: {len(members)} nodes, regions {', '.join(map(str, regions)) or '-'}; "
        f"{sum(e['state'] == 'held' for e in entries)} worker IDs held, "
        f"{sum(e['state'] == 'retired' for e in entries)} retired"
    )
    if "regions" in claims:
        shown = ", ".join(f"{r} {c['cluster']}" for r, c in claims["regions"].items()) or "none"
        print(f"region claims of this etcd (region cluster): {shown}")
    for conflict in conflicts:
        print(f"CONFLICT: {conflict}")
    for line in unlike:
        print(f"WARNING: {line}; set it alike on every node")
    if members:
        print(f"{'endpoint':<32} {'region':>6} {'rotation':<8} {'worker_ids':<16} clock offsets to peers (ms)")
        for n in members:
            endpoint = (n.get("endpoints") or [None])[0] or f"({n.get('node')}: none advertised)"
            offsets = n.get("clock_offsets_ms") or {}
            shown = ", ".join(
                f"{peer} {ms:+.1f}" for peer, ms in sorted(offsets.items()) if isinstance(ms, int | float)
            )
            ids = ",".join(str(w) for w in n.get("worker_ids") or []) or "-"
            print(
                f"{endpoint:<32} {_dash(n.get('region')):>6} "
                f"{'yes' if n.get('in_rotation') else 'no':<8} {ids:<16} {shown or '-'}"
            )
        print()
    print(f"{'region':>6} {'worker':>6} {'state':<8} {'lease_s':>7} {'renewed_s':>9} {'mark':<24} {'passed':<6} owner")
    for e in entries:
        print(
            f"{e['region']:>6} {e['worker_id']:>6} {e['state']:<8} {_dash(e.get('lease_remaining_s')):>7} "
            f"{_dash(e.get('renewed_ago_s')):>9} {e.get('mark_time', '-'):<24} "
            f"{'yes' if e.get('mark_passed') else 'no':<6} {e.get('holder') or e.get('last_holder') or ''}"
        )
    return 1 if conflicts else 0


def _nodes_status(args: argparse.Namespace) -> int:
    """``status --connect EP,EP...``: each node's own view, and whether two of them answer for
    one region from two stores (two homes: their IDs may repeat each other's). Exit status 1
    for such a conflict or a node that did not answer."""
    from .clients import Client

    _curve_keys(args)
    views: dict[str, dict] = {}
    failures: list[SnowfenceError] = []
    for endpoint in _endpoints(args):
        try:
            with Client(
                endpoint,
                timeout_s=args.timeout,
                retries=0,
                server_key=args.server_key,
                client_key=args.client_key,
                discover=False,
            ) as client:
                views[endpoint] = client.status()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        except SnowfenceError as exc:
            views[endpoint] = {"error": {"code": exc.code, "message": str(exc)}}
            failures.append(exc)
    if len(failures) == len(views):  # none answered: one line, as for one endpoint
        where = ", ".join(views)
        error = type(failures[0])(f"no endpoint answered ({failures[0]}): is snowfence serve running at {where}?")
        error.code = failures[0].code
        raise error
    homes: dict[int, tuple[str, str]] = {}
    conflicts = []
    for endpoint, status in views.items():
        region, store = status.get("region"), (status.get("broker") or {}).get("store_id")
        if type(region) is not int or not store:
            continue
        seen = homes.setdefault(region, (endpoint, store))
        if seen[1] != store:
            conflicts.append({"region": region, "endpoints": [seen[0], endpoint], "stores": [seen[1], store]})
    if args.json:
        print(orjson.dumps({"nodes": views, "conflicts": conflicts}, option=orjson.OPT_INDENT_2).decode())
    else:
        for endpoint, status in views.items():
            if "error" in status:
                print(f"{endpoint}: no answer ({status['error']['code']}: {status['error']['message']})")
                continue
            broker = status.get("broker") or {}
            print(
                f"{endpoint}: region {status.get('region')}, store {broker.get('store_id') or '(not read yet)'}, "
                f"{broker.get('mode')} mode, {broker.get('workers_in_rotation')} of "
                f"{len(broker.get('slots', []))} workers in rotation"
            )
        for c in conflicts:
            print(
                f"CONFLICT: region {c['region']} is answered from two stores, {c['endpoints'][0]} (store "
                f"{c['stores'][0]}) and {c['endpoints'][1]} (store {c['stores'][1]}): their IDs may repeat each "
                "other's. Give each store its own region, or let these nodes share one store"
            )
    return 1 if conflicts or any("error" in v for v in views.values()) else 0


def _clusters_status(configs: list, as_json: bool) -> int:
    """Several etcd clusters (one a region, say) side by side: their nodes and the
    region numbers each records; a region number two clusters use is a conflict
    (their nodes could mint the same IDs), and makes the exit status 1; so does a cluster
    its etcd knows nothing of (a mistyped --cluster would otherwise look like a quiet one)."""
    seen = []
    for config in configs:
        regions, members, claims, known, census = _read_etcd(
            config, lambda c: (c.regions(), c.nodes(), _region_claims(c), c.known(), c.census())
        )
        entry = {"cluster": config.cluster, "etcd": list(config.etcd), "regions": regions, "nodes": members}
        entry["known"] = bool(known or census or members or regions)
        seen.append({**entry, "region_claims": claims})
    unknown = [entry for entry in seen if not entry["known"]]
    users: dict[int, list[str]] = {}
    for entry in seen:
        # The regions its nodes used, and those its etcd's claims give it.
        claimed = [
            int(r) for r, c in entry["region_claims"].get("regions", {}).items() if c["cluster"] == entry["cluster"]
        ]
        for region in sorted({*entry["regions"], *claimed}):
            users.setdefault(region, []).append(entry["cluster"])
    conflicts = {region: names for region, names in sorted(users.items()) if len(names) > 1}
    if as_json:
        doc = {
            "clusters": seen,
            "conflicts": [{"region": r, "clusters": n} for r, n in conflicts.items()],
            "unknown": [entry["cluster"] for entry in unknown],
        }
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        print(f"{'cluster':<20} {'regions':<16} {'nodes':>5}  etcd")
        for entry in seen:
            regions = ",".join(map(str, entry["regions"])) or "-"
            print(f"{entry['cluster']:<20} {regions:<16} {len(entry['nodes']):>5}  {','.join(entry['etcd'])}")
        for region, names in conflicts.items():
            print(
                f"CONFLICT: region {region} is used by clusters {', '.join(names)}: their nodes can mint the same IDs; "
                "give each cluster its own region numbers"
            )
        for entry in unknown:
            print(
                f"UNKNOWN: cluster {entry['cluster']!r} is unknown to etcd at {','.join(entry['etcd'])}: no layout, "
                "node, region or worker ID of it is recorded there; is its --cluster right?"
            )
        if not conflicts:
            print("no region number is used by two clusters" + (" of those known" if unknown else ""))
    return 1 if conflicts or unknown else 0


def _dash(value) -> str:
    return "-" if value is None else str(value)
