"""Known-bad mutations of the real code, for the simulator to catch.

Each mutant edits the source text of real functions (read with ``inspect``),
compiles the edited text in the function's own module and puts it in place of
the original, in this process only. An edit whose text is no longer found fails
loudly (:class:`StaleMutant`): the list must follow the code, never silently
test nothing.
"""

from __future__ import annotations
import __future__

import importlib
import inspect
import textwrap
from dataclasses import dataclass, field

from snowfence.store import files as embedded


class StaleMutant(RuntimeError):
    """A mutant's edit no longer matches the code it mutates."""


@dataclass(frozen=True)
class Edit:
    #: "module:Class.method" or "module:function"
    target: str
    old: str
    new: str
    #: How many times ``old`` must occur in the function (0: at least once, all replaced).
    count: int = 1


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    edits: tuple[Edit, ...]
    #: The kinds of schedule that can show it ("etcd", "embedded").
    kinds: tuple[str, ...] = ("etcd", "embedded")
    requires: str = ""
    extra: dict = field(default_factory=dict)

    def available(self) -> bool:
        if self.requires == "embedded-check":
            return hasattr(embedded.FileLease, "check")
        return True


M = "snowfence.workers."
R = "snowfence.broker."
S = "snowfence.store."

MUTANTS = [
    Mutant(
        "mark-wait",
        "a new owner does not wait for the previous owner's mark (minter and state machine)",
        (
            Edit(M + "minter:Minter.start_after", "if mark_ms >= self.last_ms:", "if False:"),
            Edit(M + "states:next_state", "if now_ms <= mark_ms:", "if False:"),
        ),
    ),
    Mutant(
        "reserve-before-confirm",
        "the keeper moves the minter's reservation before the store confirmed the extension",
        (
            Edit(
                M + "keeper:Keeper.renew_once",
                "        if wanted > lease.reserved_until_ms:\n            lease.extend(wanted)",
                "        minter.reserved_until_ms = max(minter.reserved_until_ms, wanted)\n"
                "        if wanted > lease.reserved_until_ms:\n            lease.extend(wanted)",
            ),
        ),
    ),
    Mutant(
        "fence-from-reply",
        "the fence is counted from the renewal's reply instead of its send",
        (
            Edit(
                M + "keeper:Keeper.renew_once",
                "minter.fence_deadline_ns = sent + self.fence_ns",
                "minter.fence_deadline_ns = self._mono_ns() + self.fence_ns",
            ),
        ),
        kinds=("etcd",),
    ),
    Mutant(
        "release-below-last-used-etcd",
        "etcd: a release lowers the mark below the last millisecond used",
        (
            Edit(
                "snowfence.store.etcd.lease:EtcdLease.release",
                "max(last_used_ms, self.claimed_mark_ms)",
                "max(last_used_ms - 1, self.claimed_mark_ms)",
            ),
        ),
        kinds=("etcd",),
    ),
    Mutant(
        "release-below-last-used-embedded",
        "embedded: a release lowers the mark below the last millisecond used",
        (
            Edit(
                S + "files.lease:FileLease.release",
                "max(last_used_ms, self.claimed_mark_ms)",
                "max(last_used_ms - 1, self.claimed_mark_ms)",
                count=0,
            ),
        ),
        kinds=("embedded",),
    ),
    Mutant(
        "hlc-past-reservation",
        "the hybrid logical clock may mint past the reservation",
        (
            Edit(
                M + "minter:Minter.reserve",
                "if now > self.reserved_until_ms:",
                "if now > self.reserved_until_ms and not self.hlc:",
            ),
        ),
        extra={"policy": "hlc"},
    ),
    Mutant(
        "unguarded-mark-write",
        "etcd: extending the mark is not guarded by the fencing token",
        (
            Edit(
                "snowfence.store.etcd.lease:EtcdLease._write",
                "if until_ms is None else [tx.put(self.mark_key, self._mark_value(until_ms)), tx.get(self.mark_key)]",
                "if until_ms is None else [tx.put(self.mark_key, self._mark_value(until_ms)), tx.get(self.mark_key)]\n"
                "        if until_ms is not None:\n"
                "            ok, responses = self._store.client.transaction(compare=[], success=success, failure=[])\n"
                "            self.mark_rev = responses[1][0][1].mod_revision\n"
                "            self.reserved_until_ms = until_ms\n"
                "            return",
            ),
        ),
        kinds=("etcd",),
    ),
    Mutant(
        "unguarded-release",
        "etcd: a release (lower the mark, delete the claim) is not guarded by the fencing token",
        (Edit("snowfence.store.etcd.lease:EtcdLease._release", "compare=self._guard()", "compare=[]"),),
        kinds=("etcd",),
    ),
    Mutant(
        "no-fence-check",
        "the minter does not check the fence before minting",
        (
            Edit(
                M + "minter:Minter.reserve",
                "if self._mono_ns() > self.fence_deadline_ns:\n            raise Fenced(",
                "if False:\n            raise Fenced(",
            ),
        ),
        kinds=("etcd",),
    ),
    Mutant(
        "sequence-restart",
        "the minter restarts the sequence within a millisecond it already used",
        (
            Edit(
                M + "minter:Minter.reserve",
                "        elif now == last and self.seq < self._max_seq and now >= floor_ms:\n"
                "            seq = self.seq + 1",
                "        elif now == last and self.seq < self._max_seq and now >= floor_ms:\n            seq = 0",
            ),
        ),
    ),
    Mutant(
        "refusal-commits",
        "a refusal for an expired reservation still moves the minter's last millisecond",
        (
            Edit(
                M + "minter:Minter.reserve",
                "        if now > self.reserved_until_ms:\n            raise ReservationExpired(",
                "        if now > self.reserved_until_ms:\n            self.last_ms = now\n"
                "            raise ReservationExpired(",
            ),
        ),
    ),
    Mutant(
        "lease-lost-not-fenced",
        "the keeper does not fence the minter when the store says the lease is lost",
        (
            Edit(
                M + "keeper:Keeper.step",
                "            self.lost = exc\n            self.minter.fence_deadline_ns = -1\n",
                "            self.lost = exc\n",
            ),
        ),
    ),
    Mutant(
        "embedded-lock-not-rechecked",
        "embedded: the holder does not re-check that its lock file is still the one at the path",
        (
            Edit(
                S + "files.lease:FileLease.check",
                "        lock_path, mark_path = self._store.paths(self.worker_id)\n",
                "        return\n        lock_path, mark_path = self._store.paths(self.worker_id)\n",
            ),
        ),
        kinds=("embedded",),
        requires="embedded-check",
    ),
    Mutant(
        "renewal-confirms-lease-only",
        "etcd: a renewal checks the lease but not that the claim and the mark are still the holder's",
        (
            Edit(
                "snowfence.store.etcd.lease:EtcdLease._guard",
                "return [tx.create(self.claim_key) == self.token, tx.mod(self.mark_key) == self.mark_rev]",
                "return []",
            ),
        ),
        kinds=("etcd",),
    ),
    # -- the worker core (workers/core.py), as the simulator runs it
    Mutant(
        "dropped-id-left-in-rotation",
        "the worker core drops a lost worker ID but leaves it in the rotation requests are served from",
        (
            Edit(
                M + "core:WorkerCore.drop",
                "        self.held.remove(held)\n        self.ready = [h for h in self.held if h.state == READY]\n",
                "        self.held.remove(held)\n",
            ),
        ),
    ),
    Mutant(
        "refusal-left-in-rotation",
        "a worker ID whose minter refused stays in rotation (the request asks it again)",
        (
            Edit(
                M + "core:WorkerCore.on_refused",
                "        if state is not None:\n            self.set_state(held, state, str(err))",
                "        pass",
            ),
        ),
    ),
    Mutant(
        "claim-backoff-skipped",
        "a failed claim is retried at the next turn of the loop, without the back-off",
        (
            Edit(
                M + "core:WorkerCore.claim",
                "self.next_claim_ns = self.claim_retry_ns = self._mono() + int(delay * 1e9)",
                "self.next_claim_ns = self.claim_retry_ns = self._mono()",
            ),
        ),
    ),
    Mutant(
        "release-to-claimed-mark",
        "the release plan lowers the mark to the one found when claiming, not the last millisecond used",
        (
            Edit(
                M + "core:WorkerCore.release_all",
                "held.lease.release(held.minter.last_ms)",
                "held.lease.release(held.lease.claimed_mark_ms)",
            ),
        ),
    ),
    Mutant(
        "causal-token-ignored",
        "the mint step mints a request with a causal token as if it had none",
        (
            Edit(
                M + "core:WorkerCore.mint",
                "first, count = held.minter.reserve(n, held.minter.floor_after(after))",
                "first, count = held.minter.reserve(n)",
            ),
        ),
    ),
    # -- the routing core (broker/routing.py), as the simulator runs it
    Mutant(
        "retry-to-refuser",
        "a refused request is retried at any worker with room, the one that refused it included",
        (Edit(R + "routing:Routing.pick", "and not (refusers and link.ident in refusers)", "and True"),),
    ),
    Mutant(
        "silent-worker-in-rotation",
        "a worker silent past the heartbeat timeout is marked silent but stays in rotation",
        (
            Edit(
                R + "routing:Routing.tick",
                "                self._set_ready(link, False)\n                self._lose_requests(link)",
                "                self._lose_requests(link)",
            ),
        ),
    ),
    Mutant(
        "no-overload-bound",
        "a connection may have any number of requests in flight: overloaded is never answered",
        (Edit(R + "routing:Routing.admit", "elif conn.inflight >= self.max_inflight:", "elif False:"),),
    ),
    Mutant(
        "credits-ignored",
        "a worker is sent requests beyond its credits (only its minting-time budget bounds its queue)",
        (Edit(R + "routing:Routing.pick", "len(link.sent) < link.capacity\n                and ", ""),),
    ),
    Mutant(
        "regions-not-claimed",
        "a second cluster of one etcd mints in a region another cluster holds, and neither is stopped",
        (
            Edit(
                "snowfence.etcd.regions:RegionClaims.check",
                "if claim is not None and claim.cluster != cluster:",
                "if False:",
            ),
            Edit(
                "snowfence.store.etcd.lease:EtcdLease._check_region",
                "if claim is None or claim.cluster != store.config.cluster:",
                "if False:",
            ),
        ),
        kinds=("etcd",),
    ),
    Mutant(
        "new-embedded-store-no-wait",
        "a new embedded store (a wiped state directory) mints at once, below what an hlc node ran ahead to",
        (Edit(S + "files.layout:LayoutRecord.check_layout", "wait_ms = self.quarantine_ms()", "wait_ms = 0"),),
        kinds=("embedded",),
        extra={"policy": "hlc"},
    ),
    Mutant(
        "second-home-admitted",
        "a node of another state directory in the same region on the host is let serve (the region's home unchecked)",
        (Edit(S + "home:conflicts", "    return [\n", "    return [] and [\n"),),
        kinds=("embedded",),
    ),
    Mutant(
        "journal-floor-ignored",
        "a claim takes the store's mark and forgets the highest mark this node's journal saw",
        (
            Edit(
                S + "journal:Journal.floor_ms",
                "        with self._lock:\n",
                "        return -1\n        with self._lock:\n",
            ),
        ),
    ),
    Mutant(
        "own-minter-may-wait",
        "the broker's own worker ID mints with a minter that may wait for the next millisecond (in the broker's loop)",
        (
            Edit(
                R + "own:OwnWorkerId.__init__",
                "self._make_minter = functools.partial(make_minter, may_wait=False)",
                "self._make_minter = make_minter",
            ),
        ),
    ),
    Mutant(
        "own-never-gives-back",
        "the broker keeps its own worker ID when no other of the region is free",
        (Edit(R + "own:spare_rule", "return GIVE_BACK if free == 0 else KEEP", "return KEEP"),),
    ),
    Mutant(
        "intake-token-as-plain",
        "the routing core's intake (what the ZeroMQ frontend and the fast port call) admits a RESERVE with a "
        "causal token as a plain one, which the broker may mint itself without the token",
        (
            Edit(
                R + "routing:Routing.requests",
                "            if plain is None:\n                self.slow_request(meta, addr, body)\n",
                "            if plain is None and body[1] != protocol.RESERVE:\n"
                "                self.slow_request(meta, addr, body)\n"
                "            elif plain is None:\n"
                "                r = protocol.decode_request(body)\n"
                "                admit(meta, addr, body, r.count, r.request_id)\n",
            ),
        ),
    ),
    Mutant(
        "supervisor-never-kills",
        "the supervisor leaves a silent worker running",
        (
            Edit(
                R + "supervisor:Supervisor.watch_silence",
                "            if now_ns - heard_ns <= limit_ns:",
                "            if True:",
            ),
        ),
    ),
    Mutant(
        "supervisor-restarts-boot-errors",
        "the supervisor restarts a worker that cannot boot instead of halting the node",
        (Edit(R + "supervisor:Supervisor.reap", "            if status in HALT:", "            if False:"),),
    ),
    # -- the clock verdict (broker/peers.py), as the simulator's brokers take it
    Mutant(
        "clock-vouched-unheard",
        "the first clock verdict vouches as soon as the members are known, before a majority of them answered "
        "and agreed (a late host with a wrong clock claims)",
        (Edit(R + "peers:ClockJudge.judge", "if n and agreeing >= needed:", "if n:"),),
        kinds=("etcd",),
    ),
    Mutant(
        "claims-before-verdict",
        "a node claims worker IDs whatever its clock verdict (pending or refused): the worker core does not wait "
        "for it and the store does not refuse",
        (
            Edit(M + "core:WorkerCore.claim", "        if veto:\n", "        if False:\n"),
            Edit(S + "base:Store.refuse_if_vetoed", "        if self.claim_veto:\n", "        if False:\n"),
        ),
        kinds=("etcd",),
    ),
    # -- the node's decisions (broker/nodecore.py), as the simulator's brokers take them
    Mutant(
        "verdict-followed-once",
        "the broker acts on the peers' clock verdict only until the first one is in: a clock that goes off later "
        "keeps its node in rotation and claiming",
        (
            Edit(
                R + "nodecore:NodeCore.housekeeping",
                "            if peers.verdict is not self.verdict:\n",
                "            if peers.verdict is not self.verdict and self.verdict.state == PENDING:\n",
            ),
        ),
        kinds=("etcd",),
    ),
    Mutant(
        "membership-read-as-complete",
        "the node takes its membership as read before its thread has read it: with no member known, its clock "
        "counts as alone and it claims on a clock nobody checked",
        (
            Edit(
                R + "nodecore:NodeCore.follow_membership",
                "complete = membership.read_ns is not None",
                "complete = True",
            ),
        ),
        kinds=("etcd",),
    ),
    # -- the watermark (store/watermark.py), as the simulator runs it
    Mutant(
        "claim-ignores-watermark",
        "a claim's minter starts above the previous owner's mark only, not above the watermark record it read",
        (
            Edit(
                M + "core:Held.start",
                "minter.start_after(max(lease.claimed_mark_ms, lease.watermark_ms - 1))",
                "minter.start_after(lease.claimed_mark_ms)",
            ),
        ),
    ),
    Mutant(
        "floor-above-last-minted",
        "a holder publishes a floor 50 ms above the last millisecond it minted (it may still mint below it)",
        (
            Edit(
                M + "keeper:Keeper.renew_once",
                "        floor_ms = minter.last_ms\n",
                "        floor_ms = minter.last_ms + 50\n",
            ),
        ),
    ),
    Mutant(
        "loop-turn-deaf",
        "the worker loop's turn does not note a frame from the broker as word from it",
        (Edit(M + "core:WorkerCore.turn", "            self.heard = True\n", ""),),
    ),
]

#: Mutations tried and not in the list, because another guard makes them harmless: the
#: simulator cannot catch them, and no fault of the store can make them issue an ID twice.
#: - the journal not comparing revisions (Journal.check_mark, check_genesis): a store
#:   gone back is then not named and refused, but every claim still takes the journal's
#:   floor (its peak), so nothing below what this host saw is minted; "journal-floor-
#:   ignored" removes that floor and is caught;
#: - an embedded holder blind to its own mark put back (FileLease.check): the next owner's
#:   claim takes the host's journal floor, which that holder's writes raised.
#: - a claim that ignores the previous owner's mark, or reads an unreadable etcd mark as 0
#:   (EtcdStore._floor): every node reads the region's marks at each claim pass and its
#:   journal keeps their peaks, so the floor stands unless that node's journal was lost
#:   too; the simulator catches them only now and then (in about 2,500 schedules), too
#:   rarely for CI's budget;
#: - a claim that requires neither the claim key absent nor the mark unchanged
#:   (EtcdStore.try_claim, both compares removed: either one alone keeps it exclusive):
#:   caught, but only after about 2,400 schedules;
#: - a worker ID of unknown state claimed without the quarantine (EtcdStore._floor,
#:   FileStore._unknown_floor): the journal's peak and the genesis's store-wide
#:   quarantine stand in for it, except for a host that lost its journal while a mark was
#:   deleted alone; caught in one run of three within 60 s.
#: - a new store's quarantine that forgets the window its region's claim recorded
#:   (EtcdStore.quarantine_ms): it takes a host new to the cluster (an empty journal) that
#:   creates the store again after the keys were deleted, while a host with a longer window
#:   than the new one's bound mints through a partition, both on the same worker ID; the
#:   delete-under-a-cut fault makes the first two, and 1,400 schedules of 60 s did not
#:   make the last; held by tests/integration/test_partition.py (a prefix deleted under a
#:   cut-off long-window node) and tests/unit/store/test_region_claims.py.
#: Their refusals are tested where they are named (tests/unit/test_journal.py,
#: tests/integration/test_store_forgets.py).

BY_NAME = {m.name: m for m in MUTANTS}

#: Source texts of functions a mutant replaced (inspect cannot read exec'd code), so that
#: two edits of one function stack.
SOURCES: dict[object, str] = {}


def source_of(fn) -> str:
    """The source text of ``fn`` as indented in its file (or as a mutant left it)."""
    return SOURCES.get(fn) or inspect.getsource(fn)


def _resolve(target: str):
    module_name, _, path = target.partition(":")
    module = importlib.import_module(module_name)
    owner, _, name = path.rpartition(".")
    holder = getattr(module, owner) if owner else module
    return module, holder, name


def apply(mutant: Mutant) -> None:
    """Put the mutated functions in place (in this process); nothing changes if any edit is stale."""
    if not mutant.available():
        raise StaleMutant(f"{mutant.name}: the code it mutates is not there ({mutant.requires})")
    replacements = []
    for edit in mutant.edits:
        module, holder, name = _resolve(edit.target)
        fn = inspect.getattr_static(holder, name)
        src = source_of(fn)
        n = src.count(edit.old)
        if n == 0 or (edit.count and n != edit.count):
            raise StaleMutant(
                f"{mutant.name}: {edit.target} contains {edit.old!r} {n} times, not {edit.count or 'at least once'}; "
                "update tests/sim/mutants.py"
            )
        new_src = src.replace(edit.old, edit.new)
        code = compile(
            textwrap.dedent(new_src),
            f"<mutant {mutant.name}: {edit.target}>",
            "exec",
            flags=__future__.annotations.compiler_flag,
            dont_inherit=True,
        )
        namespace: dict = {}
        exec(code, module.__dict__, namespace)
        new_fn = namespace[name]
        if getattr(fn, "__wrapped__", None) is not None and not isinstance(fn, classmethod):
            # Wrapped after its body (etcd/store.py's `name = etcd_call(name)`): so is the mutant.
            new_fn = module.etcd_call(new_fn)
        replacements.append((holder, name, new_fn, new_src))
    for holder, name, new_fn, new_src in replacements:
        SOURCES[new_fn] = new_src
        setattr(holder, name, new_fn)
