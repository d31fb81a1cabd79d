"""``snowfence check-config``: the settings ``serve`` would run with, and where each came from."""

from __future__ import annotations

import argparse
import sys

import orjson

from .. import __version__
from .. import config as config_mod
from .args import add_config_flags, resolve_config


def add(sub) -> None:
    check = sub.add_parser(
        "check-config",
        help="Show the settings serve would run with, and where each came from; bind and write nothing.",
        description="Resolve the settings as `snowfence serve` would (defaults < --config file < SNOWFENCE_* "
        "environment < flags), check them as serve does before it binds anything, and print each with its "
        "source. Secrets are masked. Exit status 0 if serve would start, 78 or 73 (and one line saying why) if not.",
    )
    add_config_flags(check)
    check.add_argument("--json", action="store_true", help="Print the settings as JSON.")
    check.set_defaults(run=cmd_check_config)


def cmd_check_config(args: argparse.Namespace) -> int:
    from ..broker import preflight

    config, sources = resolve_config(args)
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
