"""Wall-clock steps for real processes: the LD_PRELOAD shim and its offset table."""

from __future__ import annotations

import mmap
import shutil
import struct
import subprocess
from pathlib import Path

SHIM_SOURCE = Path(__file__).resolve().parent.parent / "clockshim" / "clockshim.c"


def build_clockshim(out_dir: Path) -> Path:
    """Compile the shim with the system C compiler; the path of the library."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("a C compiler (cc or gcc) is needed to build the clock shim for clock-step tests")
    out = Path(out_dir) / "libclockshim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE), "-ldl"], check=True)
    return out


class ClockTable:
    """Shifts the wall clock of processes running under the clock shim."""

    SIZE = 8 + 64 * 16

    def __init__(self, path: Path, library: Path) -> None:
        self.path = path
        self.library = library
        path.write_bytes(b"\0" * self.SIZE)
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), self.SIZE)

    def env(self) -> dict:
        return {"LD_PRELOAD": str(self.library), "SNOWFENCE_CLOCKSHIM": str(self.path)}

    def shift_all(self, offset_ms: float) -> None:
        struct.pack_into("<q", self._map, 0, int(offset_ms * 1_000_000))

    def shift_pid(self, pid: int, offset_ms: float) -> None:
        free = None
        for i in range(64):
            slot_pid, _ = struct.unpack_from("<qq", self._map, 8 + 16 * i)
            if slot_pid == pid:
                free = i
                break
            if slot_pid == 0 and free is None:
                free = i
        assert free is not None, "clock table full"
        struct.pack_into("<q", self._map, 8 + 16 * free + 8, int(offset_ms * 1_000_000))
        struct.pack_into("<q", self._map, 8 + 16 * free, pid)

    def close(self) -> None:
        self._map.close()
        self._file.close()
