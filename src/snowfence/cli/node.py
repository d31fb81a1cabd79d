"""Talking to a node: the endpoints and CURVE keys of the command line checked before
anything is sent, the ``Client`` every command opens, and the layout a command reads IDs with."""

from __future__ import annotations

import argparse

from ..clients.core import DEFAULT_RETRIES
from ..errors import ConfigError
from ..ids import Layout
from ..protocol import endpoint_problem, with_scheme
from .args import load_config


def endpoints_of(args: argparse.Namespace) -> list[str]:
    """The endpoints of --connect, each checked."""
    # host:port alone is tcp://host:port, as other tools take it.
    endpoints = [with_scheme(ep.strip()) for ep in args.connect.split(",") if ep.strip()]
    if not endpoints:
        raise ConfigError("--connect needs at least one endpoint")
    for endpoint in endpoints:
        problem = endpoint_problem(endpoint)
        if problem:
            raise ConfigError(f"--connect: {problem}")
    return endpoints


def layout_for(args: argparse.Namespace):
    """The layout a command reads IDs with: the node's (STATUS) when --connect names one,
    otherwise the configured one (flags, environment, --config)."""
    if args.connect is None:
        return load_config(args).layout
    with open_client(args) as client:
        return Layout.from_dict(client.status()["layout"])


def curve_keys(args: argparse.Namespace) -> None:
    """Fail now, with the file's name, on a key the client could not use."""
    if args.server_key is None:
        if args.client_key is not None:
            raise ConfigError("--client-key needs --server-key")
        return
    from ..curve import Curve

    try:
        Curve.for_client(args.server_key, args.client_key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def open_client(args: argparse.Namespace):
    """A ``Client`` to the --connect endpoints, its flags and keys checked before it is made."""
    from ..clients import Client

    endpoints = endpoints_of(args)
    curve_keys(args)
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
