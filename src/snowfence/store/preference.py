"""Preference files: the worker ID a worker slot (or the broker) claimed last, and the
highest token it claimed each worker ID with, in the state directory."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from .durable import write_atomic

log = logging.getLogger("snowfence.lease")


def embedded_namespace(region: int) -> str:
    """Where embedded mode's preference files of ``region`` live, under last-worker-id/."""
    return f"embedded-r{region}"


def node_key(bind: str) -> str:
    """A file name for a node, stable across its restarts: from its bind endpoint."""
    safe = re.sub(r"[^A-Za-z0-9.]+", "-", bind).strip("-")[:48]
    return f"{safe}-{hashlib.sha256(bind.encode()).hexdigest()[:8]}"


#: The names of the files that record tokens: a worker slot's, and the broker's own.
RECORD_NAMES = ("slot-*", "broker")


class PreferenceFile:
    """The worker ID a worker slot claimed last, so a restart asks for it again.

    One file per node and slot: ``last-worker-id/<namespace>/<node>/slot-N``, and
    ``.../<node>/broker`` for the broker's own worker ID (see ``broker/own.py``).
    Its first line is ``<worker ID> <token>`` of the last claim; the lines after
    it keep the highest token this slot ever claimed each other worker ID with.
    Those tokens are a record of how far each worker ID's token has gone: a mark
    whose token is below a recorded one was rolled back.
    """

    def __init__(self, state_dir: str | os.PathLike, namespace: str, name: str) -> None:
        self.path = Path(state_dir) / "last-worker-id" / namespace / name

    @staticmethod
    def parse(text: str) -> list[tuple[int, int | None]]:
        """``[(worker_id, token), ...]``, the last claim first; a token is None in
        files that predate tokens. A line that does not read is left out, not the
        file: the tokens on the other lines still guard against a rolled-back mark.
        Nothing that reads gives ``[]``: no preference, no recorded token."""
        out = []
        for line in text.splitlines():
            parts = line.split()
            try:
                if not 1 <= len(parts) <= 2:
                    raise ValueError
                worker_id = int(parts[0])
                token = int(parts[1]) if len(parts) == 2 else None
            except ValueError:
                continue
            if worker_id < 0 or (token is not None and token < 0):
                continue
            out.append((worker_id, token))
        return out

    def _entries(self) -> list[tuple[int, int | None]]:
        try:
            return self.parse(self.path.read_text())
        except (OSError, UnicodeDecodeError):
            return []

    def read(self) -> int | None:
        entries = self._entries()
        return entries[0][0] if entries else None

    def write(self, worker_id: int, token: int | None = None) -> None:
        tokens = {w: t for w, t in self._entries() if t is not None}
        if token is not None:
            tokens[worker_id] = max(token, tokens.get(worker_id, token))
        lines = [f"{worker_id} {tokens[worker_id]}" if worker_id in tokens else f"{worker_id}"]
        lines += [f"{w} {t}" for w, t in sorted(tokens.items()) if w != worker_id]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Durable (the directory fsynced too): its tokens are a guard, kept across a crash.
            write_atomic(self.path, ("\n".join(lines) + "\n").encode())
        except OSError as exc:  # losing a preference costs churn and weakens the rollback check, no more
            log.warning("cannot record last worker ID in %s: %s", self.path, exc)

    @staticmethod
    def recorded_tokens(state_dir: str | os.PathLike, namespace: str) -> dict[int, int]:
        """The highest token recorded per worker ID by any node's slots in ``namespace``,
        its brokers' own included: a worker ID a broker held last is guarded as any other."""
        out: dict[int, int] = {}
        base = Path(state_dir) / "last-worker-id" / namespace
        try:
            files = [p for pattern in RECORD_NAMES for p in base.rglob(pattern) if p.suffix != ".tmp"]
        except OSError:
            return out
        for path in files:
            try:
                entries = PreferenceFile.parse(path.read_text())
            except (OSError, UnicodeDecodeError):
                continue
            for worker_id, token in entries:
                if token is not None and token > out.get(worker_id, -1):
                    out[worker_id] = token
        return out
