"""The state directory's disk for tests: a preload shim that makes the filesystem
look like NFS or makes fsync slow, and small real tmpfs mounts (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import leftovers

SHIM_SOURCE = Path(__file__).resolve().parent.parent / "fsshim" / "fsshim.c"

NFS_MAGIC = 0x6969


def build_fsshim(out_dir: Path) -> Path:
    """Compile the shim with the system C compiler; the path of the library."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("a C compiler (cc or gcc) is needed to build the filesystem shim")
    out = Path(out_dir) / "libfsshim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE), "-ldl"], check=True)
    return out


def shim_env(library: Path, *, fstype: int | None = None, fsync_ms: int | None = None) -> dict:
    env = {"LD_PRELOAD": str(library)}
    if fstype is not None:
        env["SNOWFENCE_FSSHIM_FSTYPE"] = hex(fstype)
    if fsync_ms is not None:
        env["SNOWFENCE_FSSHIM_FSYNC_MS"] = str(fsync_ms)
    return env


class Tmpfs:
    """A small tmpfs mounted at ``path``; ``fill``, ``remount`` and ``unmount`` it."""

    def __init__(self, path: Path, size: str = "4m") -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.path)], check=True)
        leftovers.register_mount(self.path)
        self.mounted = True

    def fill(self) -> Path:
        """Write a file until the filesystem is full; the file, to delete to free it."""
        filler = self.path / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        return filler

    def remount(self, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)
            self.mounted = False


def is_root() -> bool:
    return os.geteuid() == 0
