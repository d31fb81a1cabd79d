#!/bin/sh
# Load test: what a deployment delivers, and how it behaves at a set load.
#   sh examples/load_test.sh tcp://127.0.0.1:5555   (or SNOWFENCE_CONNECT=... sh examples/load_test.sh)
set -eu
EP=${1:-${SNOWFENCE_CONNECT:-tcp://127.0.0.1:5555}}
# Throughput in blocks of 4,096 (4 client processes, 4 requests in flight each).
snowfence bench --connect "$EP" --duration ${DURATION:-5} --batch 4096 --clients 4 --depth 4
# Single IDs, as many as it answers.
snowfence bench --connect "$EP" --duration ${DURATION:-5} --batch 1 --clients 4 --depth 16
# Latency at a set load: 1,000 requests/s on a fixed schedule, as JSON for a dashboard.
snowfence bench --connect "$EP" --duration ${DURATION:-5} --batch 4096 --rate 1000 --json
