"""For the whole suite: the run fails if anything it started outlives it (see leftovers.py),
and the processes it starts meet SIGHUP as from a terminal."""

import signal

from leftovers import (  # noqa: F401
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
    pytest_testnodedown,
)

pytest_plugins = ["pytester"]


def _survive_hangup(signum, frame) -> None:
    pass


def pytest_configure(config) -> None:
    # A suite run under nohup inherits SIGHUP ignored, and an ignored signal stays ignored
    # across exec: every node would be "started under nohup", and the tests of SIGHUP
    # would wait for a stop that never comes. A handler of our own keeps this run alive
    # through a hangup, as nohup asked, and exec resets it for the processes it starts.
    # (The test of a node under nohup starts it with nohup.)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _survive_hangup)
