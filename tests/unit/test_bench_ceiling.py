"""`snowfence bench` counts one ceiling whether it discovers the cluster's nodes or is held to
the one given: each node's worker IDs that mint the benchmark's requests, from its STATUS (a
node's entry in NODES lists the broker's own worker ID too, which mints only small requests:
counting it made the same run 48.8% of its ceiling with discovery and about 98% without)."""

from __future__ import annotations

import pytest

import snowfence.clients
from snowfence import protocol
from snowfence.bench import BenchSpec, minting_ids, plan

LAYOUT = {"time_bits": 41, "region_bits": 3, "worker_bits": 7, "sequence_bits": 12, "epoch_ms": 0}


def node_status(worker_id: int, own_id: int) -> dict:
    return {
        "layout": LAYOUT,
        "workers": [{"slot": 0, "worker_id": worker_id, "in_rotation": True, "state": "ready"}],
        "broker": {
            "mints_up_to": 64,
            "own_worker_id": {"ready": True, "held": [{"worker_id": own_id, "state": "ready"}]},
        },
    }


CLUSTER = {
    "tcp://a:1": node_status(1, 2),
    "tcp://b:1": node_status(3, 4),
}


class FakeClient:
    def __init__(self, endpoints, **kw) -> None:
        self.endpoint = endpoints if isinstance(endpoints, str) else endpoints[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def status(self) -> dict:
        return CLUSTER[self.endpoint]

    def nodes(self) -> dict:
        return {
            "nodes": [
                {"node": ep, "endpoints": [ep], "in_rotation": True, "worker_ids": [s["workers"][0]["worker_id"], 9]}
                for ep, s in CLUSTER.items()
            ]
        }


@pytest.fixture(autouse=True)
def fake_client(monkeypatch):
    monkeypatch.setattr(snowfence.clients, "Client", FakeClient)


@pytest.mark.parametrize("batch", [protocol.MAX_BLOCK, 10])
def test_the_ceiling_with_discovery_is_every_node_s_counted_as_one_node_s_is(batch):
    alone = plan(BenchSpec(["tcp://a:1"], batch=batch, discover=False))
    spread = BenchSpec(["tcp://a:1"], batch=batch, discover=True)
    assert plan(spread) == 2 * alone
    assert spread.endpoints == ["tcp://a:1", "tcp://b:1"]
    assert alone == (1 if batch > 64 else 2)  # the broker's own worker ID mints only requests it may take


def test_the_minting_worker_ids_of_a_status():
    status = node_status(1, 2)
    assert minting_ids(status, protocol.MAX_BLOCK) == 1
    assert minting_ids(status, 64) == 2
    status["workers"].append({"slot": 1, "worker_id": None, "in_rotation": False})
    status["broker"]["own_worker_id"]["ready"] = False
    assert minting_ids(status, 1) == 1
