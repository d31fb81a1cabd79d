"""A bare ``zmq.proxy`` relay in front of minimal minting workers.

This is the baseline the snowfence broker is measured against: the same wire
protocol, the same minter, the same number of worker processes, but a C relay
(ROUTER frontend, DEALER backend) with none of the broker's work: no credits,
no health, no retries, no status of workers. Each worker mints from a worker ID
of its own with a reservation far ahead and never fences, so nothing but
messaging is compared.

    python benchmarks/relay.py --bind ipc:///tmp/relay.sock --workers 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading

import zmq
import zmq.backend

from snowfence import protocol
from snowfence.ids import DEFAULT_LAYOUT
from snowfence.workers.minter import NEVER_NS, Minter


def worker(backend: str, worker_id: int, workers: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(backend)
    minter = Minter(DEFAULT_LAYOUT, 0, worker_id)
    minter.fence_deadline_ns = NEVER_NS
    minter.reserved_until_ms = DEFAULT_LAYOUT.max_ms
    send, recv = zmq.backend.Socket.send, zmq.backend.Socket.recv
    sndmore = int(zmq.SNDMORE)
    status = {
        "layout": DEFAULT_LAYOUT.to_dict(),
        "workers": [{"worker_id": 100 + i, "in_rotation": True} for i in range(workers)],
        "broker": {"mode": "relay"},
    }
    parent = os.getppid()
    while os.getppid() == parent:
        if not sock.poll(500):
            continue
        while True:
            try:
                addr = recv(sock, zmq.NOBLOCK)
            except zmq.Again:
                break
            body = recv(sock)
            plain = protocol.plain_reserve(body)
            if plain is not None:
                first, count = minter.reserve(plain[1])
                reply = protocol.encode_block(plain[0], first, count)
            else:
                reply = protocol.encode_status_reply(protocol.request_id_of(body), status)
            send(sock, addr, sndmore)
            send(sock, reply)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    stops = {signal.SIGTERM, signal.SIGINT}
    rundir = tempfile.mkdtemp(prefix="relay-")
    procs = []
    try:
        backend = f"ipc://{rundir}/backend"
        mp = multiprocessing.get_context("spawn")
        for i in range(args.workers):  # before the mask below: a worker dies of SIGTERM
            procs.append(mp.Process(target=worker, args=(backend, 100 + i, args.workers), daemon=True))
            procs[-1].start()
        # The proxy runs on a thread of its own, and this one waits for the signal that
        # ends it: a SIGTERM that lands in zmq.proxy's poll (or on one of libzmq's I/O
        # threads) does not reliably end the proxy. Blocked here first, the stop
        # signals stay blocked on every thread started after, and sigwait takes them.
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        ctx = zmq.Context()
        front = ctx.socket(zmq.ROUTER)
        front.bind(args.bind)
        back = ctx.socket(zmq.DEALER)
        back.bind(backend)
        threading.Thread(target=zmq.proxy, args=(front, back), name="proxy", daemon=True).start()
        signal.sigwait(stops)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)
        shutil.rmtree(rundir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
