"""For the whole suite: the run fails if anything it started outlives it (see leftovers.py)."""

from leftovers import pytest_sessionfinish, pytest_sessionstart, pytest_terminal_summary  # noqa: F401

pytest_plugins = ["pytester"]
