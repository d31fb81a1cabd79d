"""Where a client's requests go: the endpoints, when to ask the cluster for them
(NODES), and which one to go to when the current one fails (:class:`Directory`)."""

from __future__ import annotations

import itertools
import random

from ... import protocol
from ...errors import StoreConflict

#: How often a client asks for the cluster's nodes (NODES), besides on connect and after a failure.
DISCOVER_EVERY_S = 5.0
#: The longest a NODES request may take before the client carries on without the answer.
DISCOVER_TIMEOUT_S = 1.0


class Directory:
    """The endpoints a client uses, which one it uses now, and where it goes when that
    one fails: the seeds it was given and, with discovery, the nodes the brokers
    report in answer to NODES.

    The client asks on connect, again after a failure, and every
    ``DISCOVER_EVERY_S``. The endpoints it uses are the nodes in rotation, those
    of its own ``region`` first when it was told which that is, then the nodes
    listed but out of rotation (they may be back by the time they are needed),
    then the seeds it was given that no answer lists (a seed may be a load
    balancer, or down for now). Its first answer sends it to a node picked at
    random among the preferred ones, so clients given the same seed spread over
    the cluster; a node that appears later is new capacity, and a client moves to
    it when it learns of it. A node that leaves the answer is left when the
    client next moves. Without ``discover`` the list is the seeds.

    When the current endpoint fails (:meth:`failed`), the client moves to the
    endpoint that failed longest ago, one that has not failed first, in list
    order after the failed one. A dead node stays listed until its membership
    lease lapses, and a node cut off from its clients but not from etcd stays
    listed for good; so a failure is remembered until that endpoint answers
    again, and the random picks above avoid an endpoint that failed while
    another will do.
    """

    def __init__(self, seeds: list[str], *, discover: bool, region: int | None, rng: random.Random | None = None):
        self.seeds = list(seeds)
        self.discover = discover
        self.region = region
        self.endpoints = list(seeds)
        #: Where the client sends its requests now.
        self.current = self.endpoints[0]
        #: The preferred endpoints as of the last answer (own region, or all).
        self.preferred: list[str] = []
        #: Every endpoint an answer has listed in rotation; None before the first answer.
        self.seen: set[str] | None = None
        #: Endpoints that failed and have not answered since, with the order of their
        #: failures (higher: later).
        self.failures: dict[str, int] = {}
        self._failure_count = itertools.count(1)
        self._next_ns = 0
        self._rng = rng or random.Random()
        #: The store each endpoint said its region's worker IDs come from: {endpoint: (region, store ID)}.
        self.homes: dict[str, tuple[int, str]] = {}
        #: Two stores answering for one region (see :meth:`note_homes`); every call raises it.
        self.conflict: StoreConflict | None = None

    def due(self, now_ns: int) -> bool:
        return self.discover and now_ns >= self._next_ns

    def asked(self, now_ns: int) -> None:
        self._next_ns = now_ns + int(DISCOVER_EVERY_S * 1e9)

    def on_failure(self) -> None:
        """Something failed: learn the cluster again at the next chance."""
        self._next_ns = 0

    def failed(self) -> str:
        """The current endpoint let a request time out or refused it: remember that,
        learn the cluster again at the next chance, and move on. Returns the
        endpoint moved to (the same one when it is the only one)."""
        self.on_failure()
        self.failures[self.current] = next(self._failure_count)
        eps = self.endpoints
        start = eps.index(self.current) + 1 if self.current in eps else 0
        self.current = min(eps[start:] + eps[:start], key=lambda ep: self.failures.get(ep, 0))
        return self.current

    def answered(self) -> None:
        """The current endpoint replied: it is no longer one that failed."""
        if self.failures:
            self.failures.pop(self.current, None)

    def untried(self, unresponsive: set[str]) -> bool:
        """Whether an endpoint is known that is not among ``unresponsive``."""
        return any(ep not in unresponsive for ep in self.endpoints)

    def learn(self, answer: dict) -> str | None:
        """Take a NODES answer; the endpoint to move to, or None to stay on the current one."""
        nodes = [n for n in answer.get("nodes") or () if isinstance(n, dict)]
        usable = []
        for n in nodes:
            eps = n.get("endpoints")
            if isinstance(eps, list) and eps and isinstance(eps[0], str) and not protocol.endpoint_problem(eps[0]):
                usable.append(n)
        serving = [n for n in usable if n.get("in_rotation", True)] or usable
        if not serving:
            return None  # nothing to go by: keep what we have
        mine = [n for n in serving if self.region is not None and n.get("region") == self.region]
        preferred = [n["endpoints"][0] for n in (mine or serving)]
        others = [n["endpoints"][0] for n in serving if n["endpoints"][0] not in preferred]
        listed = set(preferred) | set(others)
        resting = [ep for ep in dict.fromkeys(n["endpoints"][0] for n in usable) if ep not in listed]
        known = listed | set(resting)
        self.endpoints = [*preferred, *others, *resting, *(s for s in self.seeds if s not in known)]
        self.preferred = preferred
        self.failures = {ep: n for ep, n in self.failures.items() if ep in self.endpoints}
        first, seen = self.seen is None, self.seen or set()
        self.seen = seen | listed
        new = [ep for ep in preferred if ep not in seen]
        if first:
            target = self._pick(preferred)
        elif new:
            target = self._pick(new)
        elif self.current not in listed:
            target = self._pick(preferred)  # it left: go on, and not all to the same one
        else:
            return None
        return None if target == self.current else target

    def note_homes(self, answer: dict) -> None:
        """Take the store IDs a NODES answer gives (each node's, from any endpoint it came
        from). Two nodes that answer for one region from two stores lease the same worker IDs
        from both: their IDs may repeat each other's, so the client goes on with neither
        (:attr:`conflict`, raised by every call from then on)."""
        for n in answer.get("nodes") or ():
            if not isinstance(n, dict):
                continue
            eps, region, store = n.get("endpoints"), n.get("region"), n.get("store_id")
            if isinstance(eps, list) and eps and isinstance(eps[0], str) and type(region) is int and store:
                self.homes[eps[0]] = (region, str(store))
        if self.conflict is not None:
            return
        first: dict[int, tuple[str, str]] = {}
        for ep, (region, store) in self.homes.items():
            seen = first.setdefault(region, (ep, store))
            if seen[1] != store:
                self.conflict = StoreConflict(
                    f"region {region} is answered from two stores: {seen[0]} (store {seen[1]}) and {ep} "
                    f"(store {store}); the IDs of one may repeat the other's, so this client uses neither. "
                    "Give each store its own region, or let these nodes share one store"
                )
                return

    def _pick(self, candidates: list[str]) -> str:
        """One of ``candidates`` at random among those that have not failed, else the one that failed longest ago."""
        fine = [ep for ep in candidates if ep not in self.failures]
        return self._rng.choice(fine) if fine else min(candidates, key=self.failures.__getitem__)
