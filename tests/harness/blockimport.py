"""Run a Python process as if some packages were not installed.

``blocking_env(tmp, "pyetcd", "grpc")`` returns an environment whose Python
processes fail to import those top-level packages with ModuleNotFoundError,
as on a machine without them: a ``sitecustomize`` on PYTHONPATH puts a finder
ahead of every other on ``sys.meta_path``.
"""

from __future__ import annotations

import os
from pathlib import Path

_SITECUSTOMIZE = """
import os, sys

_BLOCKED = set(os.environ.get("BLOCKIMPORT_MODULES", "").split(","))


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


def blocking_env(tmp: Path, *packages: str) -> dict:
    site = tmp / "block-imports"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "BLOCKIMPORT_MODULES": ",".join(packages)}
