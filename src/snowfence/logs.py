"""Logging: plain text for people, or one JSON object per event for machines.

Every state change is logged through :func:`event` with a stable event name
(``claimed``, ``fenced``, ``clock_unsafe``, ``rejoined``, ``restarted``, ...) so
alerts can key on the name rather than on the wording of a message.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import orjson

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def event(logger: logging.Logger, name: str, message: str = "", *, level: int = logging.INFO, **fields) -> None:
    """Log a named event with structured fields."""
    if logger.isEnabledFor(level):
        logger.log(level, message or name, extra={"event": name, "fields": fields})


class _TextFormatter(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        text = (
            f"{stamp}.{int(record.msecs):03d}Z {record.levelname:<7} {self.role}[{os.getpid()}] {record.getMessage()}"
        )
        name = getattr(record, "event", None)
        fields = getattr(record, "fields", None)
        if name and name != record.getMessage():
            text += f" event={name}"
        if fields:
            text += "".join(f" {k}={v}" for k, v in fields.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _JsonFormatter(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            # The monotonic clock is shared by every process of a host and never
            # steps: events of several processes order by it even when a wall
            # clock was stepped.
            "mono_s": round(time.monotonic(), 6),
            "level": record.levelname.lower(),
            "role": self.role,
            "pid": os.getpid(),
            "event": getattr(record, "event", None) or "log",
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            # A field named like a top-level key (a worker's "pid" in a broker's event)
            # must not be lost, nor overwrite the record's own: it goes under "fields".
            clashes = {}
            for key, value in fields.items():
                if key in doc or key in ("fields", "exception"):
                    clashes[key] = value
                else:
                    doc[key] = value
            if clashes:
                doc["fields"] = clashes
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def setup(level: str = "info", fmt: str = "text", role: str = "snowfence") -> None:
    """Send snowfence's logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter(role) if fmt == "json" else _TextFormatter(role))
    root = logging.getLogger("snowfence")
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.INFO))
    root.propagate = False


def set_process_title(title: str, short: str) -> None:
    """Name this process in ``ps`` (its command line, with setproctitle) as ``title``, and in ``top``
    (/proc/self/comm, 15 bytes) as ``short``, which has no spaces: /proc/PID/stat stays split by spaces."""
    try:
        from setproctitle import setproctitle

        setproctitle(title)
    except ImportError:  # an install without it: the short name only
        pass
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(short[:15])
    except OSError:
        pass
