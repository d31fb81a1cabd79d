"""``snowfence keygen``: write a CURVE key pair."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ConfigError
from ..workers.exits import Exit


def add(sub) -> None:
    keygen = sub.add_parser("keygen", help="Write a CURVE key pair: NAME.key (public) and NAME.key_secret.")
    keygen.add_argument("name", metavar="NAME")
    keygen.add_argument("--dir", default=".", help="Directory to write into (default: the current one).")
    keygen.add_argument(
        "--force",
        action="store_true",
        help="Replace a key pair of that name (clients holding its public key are locked out until given the new one).",
    )
    keygen.set_defaults(run=cmd_keygen)


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
