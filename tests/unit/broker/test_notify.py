"""sd_notify without libsystemd: what goes to the service manager's socket, and nothing without one."""

from __future__ import annotations

import socket

import pytest

from snowfence.broker.notify import ENV, Notifier


@pytest.fixture
def manager(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(5)
    yield sock
    sock.close()


def test_fields_go_in_one_datagram_and_the_variable_leaves_the_environment(manager):
    environ = {ENV: manager.getsockname(), "OTHER": "x"}
    notifier = Notifier(environ)
    assert environ == {"OTHER": "x"}, "children must not inherit it"
    assert notifier.notify(READY="1", STATUS="serving on tcp://127.0.0.1:5555")
    assert manager.recv(4096) == b"READY=1\nSTATUS=serving on tcp://127.0.0.1:5555"


@pytest.mark.parametrize("value", ["", "relative/path", "vsock:2:1234", "@"])
def test_without_a_unix_socket_to_talk_to_nothing_is_sent(value):
    assert Notifier({ENV: value} if value else {}).notify(READY="1") is False


def test_a_manager_that_went_away_is_not_an_error(tmp_path):
    assert Notifier({ENV: str(tmp_path / "gone")}).notify(STOPPING="1") is False
