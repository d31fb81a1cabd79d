"""Client calls in a process of their own, one per line asked on stdin, for tests that a
call never hangs: a hung call hangs this process, not the test, which kills it.

    python calls.py '{"kind": "sync", "endpoint": ..., "timeout_s": 0.5, "retries": 0, ...}'

then, for each line ``reserve N`` / ``status`` / ``ids N`` read on stdin, one JSON line
on stdout: ``{"ok": bool, "error": class name, "code", "message", "s": seconds taken}``.
``kind`` is ``sync`` (:class:`snowfence.Client`) or ``async`` (:class:`snowfence.AsyncClient`);
the other keys are the client's keyword arguments. One client serves every call, as
in a service that keeps its client.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from snowfence import AsyncClient, Client
from snowfence.errors import SnowfenceError


def outcome(started: float, error: BaseException | None = None) -> str:
    took = time.monotonic() - started
    if error is None:
        return json.dumps({"ok": True, "s": took})
    return json.dumps(
        {
            "ok": False,
            "error": type(error).__name__,
            "code": getattr(error, "code", None),
            "retriable": getattr(error, "retriable", None),
            "message": str(error),
            "s": took,
        }
    )


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_sync(endpoint, kw: dict) -> None:
    with Client(endpoint, **kw) as client:
        for line in sys.stdin:
            what, *arg = line.split()
            started = time.monotonic()
            try:
                if what == "reserve":
                    client.reserve(int(arg[0]))
                elif what == "ids":
                    stream = client.ids()
                    for _ in range(int(arg[0])):
                        next(stream)
                else:
                    getattr(client, what)()
            except SnowfenceError as exc:
                say(outcome(started, exc))
            else:
                say(outcome(started))


async def run_async(endpoint, kw: dict) -> None:
    loop = asyncio.get_running_loop()
    async with AsyncClient(endpoint, **kw) as client:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            what, *arg = line.split()
            started = time.monotonic()
            try:
                if what == "reserve":
                    await client.reserve(int(arg[0]))
                elif what == "ids":
                    stream = client.ids()
                    for _ in range(int(arg[0])):
                        await anext(stream)
                    await stream.aclose()
                else:
                    await getattr(client, what)()
            except SnowfenceError as exc:
                say(outcome(started, exc))
            else:
                say(outcome(started))


def main() -> None:
    settings = json.loads(sys.argv[1])
    kind = settings.pop("kind")
    endpoint = settings.pop("endpoint")
    if kind == "sync":
        run_sync(endpoint, settings)
    else:
        asyncio.run(run_async(endpoint, settings))


if __name__ == "__main__":
    main()
