"""The Python client (``snowfence.Client``) behind the conformance suite's driver protocol
(tests/conformance/README.md): one case per line on stdin, one answer per line on stdout.

    python tests/conformance/drivers/python_client.py
"""

from __future__ import annotations

import json
import sys

from snowfence import Client
from snowfence.errors import SnowfenceError


def perform(case: dict) -> dict:
    kind = case.get("case")
    if kind not in ("reserve", "nodes", "watermark"):
        return {"unsupported": True}
    with Client(case["endpoint"], discover=False) as client:
        if kind == "nodes":
            return {"nodes": client.nodes()}
        if kind == "watermark":
            promise = client.watermark()
            return {"watermark": {"unix_ms": promise.unix_ms, "lowest": str(promise.lowest)}}
        after = case.get("after")
        blocks = client.reserve(case["count"], after=None if after is None else int(after))
        return {"ids": [str(id_) for block in blocks for id_ in block.range()]}


def main() -> int:
    for line in sys.stdin:
        case = json.loads(line)
        try:
            answer = perform(case)
        except SnowfenceError as err:
            answer = {"error": {"code": err.code, "retriable": err.retriable}}
        print(json.dumps({"id": case.get("id"), **answer}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
