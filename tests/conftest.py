"""For the whole suite: the run fails if anything it started outlives it (see leftovers.py),
the processes it starts meet SIGHUP as from a terminal, and each test process is a host
of its own (see netns.py)."""

import os
import signal

import netns
import pytest
from leftovers import (  # noqa: F401
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
    pytest_testnodedown,
)

pytest_plugins = ["pytester"]


def _survive_hangup(signum, frame) -> None:
    pass


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config) -> None:
    # Two test processes at once need a network namespace each (netns.py), which takes
    # root: without it, the tests run one at a time.
    if os.geteuid() != 0 and config.getoption("numprocesses", None):
        config.option.numprocesses = 0
        config.option.dist = "no"


def pytest_collection_modifyitems(config, items) -> None:
    # The test processes share the work test by test (`--dist loadgroup`), so that one long
    # file does not hold the run back; tests that share something made once are kept on one
    # process: the conformance suite (its servers are made once per process), and each
    # module whose tests share a module fixture (a node, a built client, an installed venv).
    for item in items:
        group = _shared_with(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def _shared_with(item) -> str | None:
    """The group a test must run in (with the others sharing what it uses), or None."""
    if "conformance" in item.path.parts:
        return "conformance"
    defs = getattr(item, "_fixtureinfo", None)
    for fixturedefs in defs.name2fixturedefs.values() if defs else ():
        if fixturedefs and fixturedefs[-1].scope in ("module", "package"):
            return item.nodeid.split("::")[0]
    return None


def pytest_configure(config) -> None:
    # Every process that runs tests (an xdist worker, or the only process) moves into a
    # network namespace of its own before it starts anything; the xdist controller runs none.
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        netns.isolate()
    # A suite run under nohup inherits SIGHUP ignored, and an ignored signal stays ignored
    # across exec: every node would be "started under nohup", and the tests of SIGHUP
    # would wait for a stop that never comes. A handler of our own keeps this run alive
    # through a hangup, as nohup asked, and exec resets it for the processes it starts.
    # (The test of a node under nohup starts it with nohup.)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _survive_hangup)
