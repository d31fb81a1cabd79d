"""Fixtures the unit tests of more than one module share."""

from __future__ import annotations

import pytest
from etcdrig import Etcd


@pytest.fixture
def etcd() -> Etcd:
    """An in-memory etcd on a fake clock (see ``etcdrig``)."""
    return Etcd()
