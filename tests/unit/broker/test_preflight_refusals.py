"""preflight.check, as serve and check-config both run it: one endpoint to bind, a usable
journal directory, and the layout the store recorded (read without writing anything)."""

from __future__ import annotations

import os

import orjson
import pytest

from snowfence.broker import preflight
from snowfence.config import Config
from snowfence.errors import ConfigError, LayoutMismatch, StateDirError
from snowfence.store import open_store


def recorded(state) -> Config:
    config = Config(state_dir=str(state))
    store = open_store(config)
    store.check_layout(config.layout)
    store.close()
    return config


def test_two_endpoints_in_bind_are_refused():
    with pytest.raises(ConfigError, match="names 2 endpoints; a node binds one"):
        preflight.check_bind(Config(bind="tcp://127.0.0.1:5555,tcp://127.0.0.1:5556"))
    preflight.check_bind(Config(bind="tcp://127.0.0.1:5555"))


def test_a_journal_directory_that_cannot_be_made_is_refused_without_touching_anything(tmp_path):
    (tmp_path / "file").write_text("")
    config = Config(state_dir=str(tmp_path / "state"), journal_dir=str(tmp_path / "file" / "journal"))
    with pytest.raises(StateDirError, match=r"^journal directory .* is not usable"):
        preflight.check(config, create=False)
    assert not (tmp_path / "state").exists()


def files(state) -> dict:
    return {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}


def test_a_layout_other_than_the_recorded_one_is_refused_and_no_record_is_changed(tmp_path):
    config = recorded(tmp_path / "state")
    before = files(tmp_path / "state")
    other = Config(state_dir=config.state_dir, time_bits=42, sequence_bits=11)
    with pytest.raises(LayoutMismatch, match="was created for layout"):
        preflight.check(other, create=False)
    assert files(tmp_path / "state") == before
    preflight.check(config, create=False)  # the recorded one passes


def test_a_new_state_directory_has_no_layout_to_compare_and_an_unreadable_record_is_refused(tmp_path):
    assert preflight.recorded_layout(Config(state_dir=str(tmp_path / "new"))) is None
    preflight.check(Config(state_dir=str(tmp_path / "new")), create=False)
    assert not os.path.exists(tmp_path / "new")
    os.makedirs(tmp_path / "bad")
    (tmp_path / "bad" / "layout.json").write_bytes(orjson.dumps([1]))
    with pytest.raises(ConfigError):
        preflight.check(Config(state_dir=str(tmp_path / "bad")), create=False)
