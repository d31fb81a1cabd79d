"""Run a fault profile and check that nothing was minted twice.

    python tests/chaos/run.py --profile short            # a few minutes (what CI runs)
    python tests/chaos/run.py --profile embedded         # embedded mode, its state directory tampered
    python tests/chaos/run.py --profile long --minutes 10 --seed 3
    python tests/chaos/run.py --break mark-wait          # show the checker catching a broken guard

Prints the figures (IDs checked, faults by kind, availability, recovery) and
exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["short", "long", "embedded", "embedded-long"], default="short")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the long profile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--break",
        dest="guard",
        choices=["mark-wait"],
        help="run the skewed-takeover scenario against a copy of snowfence with this guard disabled",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the verdict as JSON")
    parser.add_argument("--dir", help="keep the run's files (logs, client records) here")
    args = parser.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="snowfence-chaos-"))
    if args.guard:
        verdict = chaos.skewed_takeover(root / "run", pythonpath=chaos.broken_copy(root, args.guard))
    elif args.profile.startswith("embedded"):
        if args.profile == "embedded":
            kinds = chaos.EMBEDDED_SHORT
        else:
            kinds = chaos.long_schedule(random.Random(args.seed), args.minutes, chaos.EMBEDDED_FAULTS)
        verdict = chaos.run(root / "run", kinds, seed=args.seed, nodes_count=2, embedded=True)
        print(chaos.report(verdict))
    else:
        kinds = chaos.SHORT if args.profile == "short" else chaos.long_schedule(random.Random(args.seed), args.minutes)
        verdict = chaos.run(root / "run", kinds, seed=args.seed)
        print(chaos.report(verdict))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "ids": verdict.ids,
                    "blocks": verdict.blocks,
                    "calls": verdict.calls,
                    "outcomes": dict(verdict.outcomes),
                    "faults": verdict.faults,
                    "violations": verdict.violations,
                },
                indent=2,
            )
        )
    print(f"files: {root}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
