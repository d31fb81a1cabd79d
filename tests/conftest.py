"""For the whole suite: the run fails if anything it started outlives it (see leftovers.py)."""

from leftovers import (  # noqa: F401
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
    pytest_testnodedown,
)

pytest_plugins = ["pytester"]
