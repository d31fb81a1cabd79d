"""Which filesystem holds a path (statfs(2)), and which ones a state directory cannot live on.

The file store refuses the filesystems whose flock(2) is not known to be exclusive
(:data:`UNSAFE_FILESYSTEMS`); ``serve`` and ``check-config`` refuse, before anything is
written, a state or journal directory on one of the kernel's own (:data:`KERNEL_FILESYSTEMS`)."""

from __future__ import annotations

import ctypes
import os

#: statfs(2) f_type of filesystems whose flock(2) is not known to be exclusive
#: across processes and hosts (linux/magic.h).
UNSAFE_FILESYSTEMS = {
    0x6969: "NFS",
    0x65735546: "FUSE",
    0xFF534D42: "CIFS",
    0xFE534D42: "SMB2",
    0x517B: "SMB",
    0x01021997: "9P",
    0x00C36400: "Ceph",
    0x5346414F: "AFS",
    0x73757245: "Coda",
    0x01161970: "GFS2",
    0x7461636F: "OCFS2",
    0x0BD00BD0: "Lustre",
    0x47504653: "GPFS",
}

#: statfs(2) f_type of the kernel's own filesystems (linux/magic.h): no state can be kept there, by root either.
KERNEL_FILESYSTEMS = {
    0x9FA0: "proc",
    0x62656572: "sysfs",
    0x27E0EB: "cgroup",
    0x63677270: "cgroup2",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0x73636673: "securityfs",
    0xCAFE4A11: "bpf",
    0x1CD1: "devpts",
    0x6165676C: "pstore",
    0x62656570: "configfs",
    0xDE5E81E4: "efivarfs",
    0x19800202: "mqueue",
    0x42494E4D: "binfmt_misc",
}


def filesystem_type(path: str | os.PathLike) -> int | None:
    """statfs(2) f_type of the filesystem holding ``path``; None if it cannot be read."""
    try:
        statfs = ctypes.CDLL(None, use_errno=True).statfs
    except (OSError, AttributeError):
        return None
    buf = ctypes.create_string_buffer(512)  # larger than struct statfs on any ABI
    if statfs(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF  # f_type is the first field
