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

Each command is a module of this package (``COMMANDS``): its ``add`` makes its parser and
names the function that runs it. ``args`` holds what several commands read off the command
line, ``node`` how a command talks to a node.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from .. import config as config_mod
from ..errors import ConfigError, HandshakeRefused, SnowfenceError, StateDirError
from ..workers.exits import Exit
from . import bench, check_config, cluster, completion, decode, keygen, reserve, restore, serve, status, times, verify
from .args import Parser, Plain

#: The modules of the commands, in the order --help and the completion scripts list them.
COMMANDS = (serve, check_config, reserve, decode, times, bench, keygen, status, restore, cluster, verify, completion)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="snowfence", description="64-bit, time-ordered IDs that are never issued twice.")
    parser.add_argument("-V", "--version", action="version", version=f"snowfence {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add(sub)
    # The completion scripts list every command and flag of this very parser.
    parser.set_defaults(parser=parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        if args.command != "serve":  # serve logs it (serve.cmd_serve)
            for line in config_mod.unknown_env():
                print(f"snowfence: warning: {line}", file=sys.stderr)
        return args.run(args)
    except StateDirError as exc:
        print(f"snowfence: {exc}", file=sys.stderr)
        return Exit.CANTCREAT
    except ConfigError as exc:
        print(f"snowfence: {exc}", file=sys.stderr)
        return Exit.CONFIG
    except Plain as exc:
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
