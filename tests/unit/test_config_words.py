"""Settings refused in words: what is expected, not a Python type; an unresolvable bind host named as such."""

from __future__ import annotations

import re

import pytest

from snowfence.config import Config
from snowfence.errors import ConfigError


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("etcd", 5, "an array of strings"),
        ("workers", "many", "a whole number is expected"),
        (
            "metrics_interval_s" if "metrics_interval_s" in Config.__dataclass_fields__ else "etcd_timeout_s",
            "x",
            "a number",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_in_words(field, value, words):
    with pytest.raises(ConfigError) as err:
        Config(**{field: value})
    text = str(err.value)
    assert words in text and not re.search(r"tuple\[|valid (int|float|str|bool)\b", text), text


def test_an_unresolvable_bind_host_is_said_to_be_unresolvable():
    with pytest.raises(ConfigError) as err:
        Config(bind="tcp://no-such-host.invalid:5555")
    text = str(err.value)
    assert "cannot be resolved" in text and "No such device" not in text, text


def test_bind_hosts_that_resolve_pass():
    for bind in ("tcp://127.0.0.1:0", "tcp://*:0", "tcp://localhost:0", "tcp://lo:0", "ipc:///tmp/x.sock"):
        Config(bind=bind)
