"""``open_store`` decides each store's journal, by one rule for both stores: the file store
always has the node's (in ``journal_dir``, else ``<state_dir>/journal``), the etcd store has it
unless the caller runs away from the node's state directory (``journal=False``)."""

from __future__ import annotations

import pytest
from etcdrig import config as etcd_config

from snowfence.config import Config
from snowfence.ids import DEFAULT_LAYOUT
from snowfence.store import open_store
from snowfence.store.files import FileStore


@pytest.mark.parametrize("journal", [True, False])
def test_the_file_store_always_has_the_nodes_journal_where_the_settings_put_it(tmp_path, journal):
    config = Config(state_dir=str(tmp_path / "state"), journal_dir=str(tmp_path / "elsewhere"))
    store = open_store(config, journal=journal)
    assert store.journal.path == tmp_path / "elsewhere" / "embedded.json"
    assert not store.journal.marks_store_wide
    default = open_store(Config(state_dir=str(tmp_path / "other")), journal=journal)
    assert default.journal.path == tmp_path / "other" / "journal" / "embedded.json"


def test_the_etcd_store_has_the_nodes_journal_unless_it_is_opened_without_one(tmp_path):
    config = etcd_config(state_dir=str(tmp_path / "state"), journal_dir=str(tmp_path / "elsewhere"))
    store = open_store(config)
    assert store.journal.path == tmp_path / "elsewhere" / "etcd-unit.json"
    assert store.journal.marks_store_wide  # a mark gone back: the whole store went back
    assert open_store(config, journal=False).journal is None


def test_the_file_store_picks_no_journal_of_its_own(tmp_path):
    with pytest.raises(TypeError, match="journal"):
        FileStore(tmp_path, DEFAULT_LAYOUT, 0)
