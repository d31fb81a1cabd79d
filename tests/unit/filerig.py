"""The file store as the unit tests build it: with the journal a node keeps when it is given
no journal directory (``<state_dir>/journal``), unless a test gives another. (A node's
store is built by ``open_store``, which decides its journal; the tests build the class.)"""

from __future__ import annotations

import os
from pathlib import Path

from snowfence.store.files import FileStore
from snowfence.store.journal import Journal


def file_store(state_dir: str | os.PathLike, layout, region: int, **settings) -> FileStore:
    if "journal" not in settings:
        settings["journal"] = Journal(Path(state_dir) / "journal", "embedded")
    return FileStore(state_dir, layout, region, **settings)
