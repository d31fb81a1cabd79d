"""Bulk loader: reserve IDs for a whole batch of rows up front, then load them.

    python examples/bulk_loader.py --connect tcp://127.0.0.1:5555 --rows 1000000 --out rows.csv

One `reserve()` call asks for every ID the batch needs (pipelined over the
workers, about a second for a million on a 2-core machine); the IDs go into
the rows as they are written. The same shape feeds PostgreSQL's
`COPY table FROM STDIN` or any other bulk path.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

from snowfence import Client, SnowfenceError, as_array


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connect", default=os.environ.get("SNOWFENCE_CONNECT", "tcp://127.0.0.1:5555"))
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", default="-")
    args = parser.parse_args()

    try:
        with Client(args.connect.split(","), timeout_s=5.0) as client:
            blocks = client.reserve(args.rows)  # blocks whose counts sum to --rows
    except SnowfenceError as exc:  # one line, not a traceback: the node is not there, say
        print(f"bulk_loader: {exc.code}: {exc}", file=sys.stderr)
        return 1
    ids = as_array(blocks)  # one flat array('q'); as_numpy(blocks) if NumPy is installed

    out = sys.stdout if args.out == "-" else open(args.out, "w", newline="")
    with out:
        writer = csv.writer(out)
        writer.writerow(["id", "payload"])
        for row, id_ in enumerate(ids):
            writer.writerow([id_, f"row {row}"])
    print(f"wrote {len(ids)} rows with IDs {ids[0]} .. {ids[-1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
