"""The accepted-restore decision both stores share (store/genesis.py's restore_base)."""

from __future__ import annotations

import dataclasses

import pytest

from snowfence.errors import LayoutMismatch
from snowfence.ids import DEFAULT_LAYOUT, Layout
from snowfence.store.genesis import Genesis, restore_base

NOW = 1_800_000_000_000
OTHER = Layout(worker_bits=5, sequence_bits=14)


def base(recorded, marks, layout=DEFAULT_LAYOUT):
    return restore_base(recorded, marks, layout, now_unix_ms=NOW, window_ms=5000, where="the store")


def test_a_gone_record_starts_a_new_genesis_and_every_mark_counts_as_used():
    genesis, used = base(None, [(0, 3, DEFAULT_LAYOUT.digest(), "m3"), (1, 7, None, "m7")])
    assert genesis.layout == DEFAULT_LAYOUT and genesis.window_ms == 5000 and genesis.upgraded
    assert used == {0: {3}, 1: {7}}


def test_the_recorded_genesis_is_kept_and_its_used_worker_ids_added():
    recorded = dataclasses.replace(
        Genesis.create(DEFAULT_LAYOUT, now_unix_ms=NOW - 10, window_ms=9000), used={2: frozenset({1})}
    )
    genesis, used = base(recorded, [(2, 4, None, "m")])
    assert genesis is recorded and used == {2: {1, 4}}


def test_an_older_releases_record_is_replaced_by_a_legacy_genesis():
    older = dataclasses.replace(Genesis.create(DEFAULT_LAYOUT, now_unix_ms=NOW - 10, window_ms=0), store_id=None)
    assert not older.upgraded
    genesis, _ = base(older, [])
    assert genesis.legacy and genesis.upgraded


def test_a_mark_or_a_record_of_another_layout_is_refused():
    with pytest.raises(LayoutMismatch, match="m9 was written under another layout"):
        base(None, [(0, 9, OTHER.digest(), "m9")])
    with pytest.raises(LayoutMismatch, match="the store records layout"):
        base(Genesis.create(OTHER, now_unix_ms=NOW, window_ms=0), [])
