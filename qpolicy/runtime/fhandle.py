"""name_to_handle_at(2) and open_by_handle_at(2) through libc: Python's standard library has
no binding.

A cgroup v2 directory's file handle is its kernfs node id, which is the cgroup's id (the inode
number of its directory, what ``bpf_get_current_cgroup_id()`` returns): fs/kernfs/mount.c,
``kernfs_encode_fh`` writes the id as the handle, of type ``FILEID_KERNFS``, and
``kernfs_fh_to_dentry`` finds the node by it. So a cgroup can be opened by its id alone, without
walking the hierarchy for the directory of that inode. Opening by handle needs
CAP_DAC_READ_SEARCH.
"""

from __future__ import annotations

import ctypes
import os
import struct

from qpolicy.runtime.libc import libc

#: include/linux/exportfs.h: a kernfs node's handle, its 64-bit id (Linux 5.5 and later).
FILEID_KERNFS = 0xFE
_AT_FDCWD = -100
_MAX_HANDLE_SZ = 128
_HEADER = struct.Struct("Ii")  # struct file_handle: handle_bytes, handle_type


def handle_of(path: str) -> tuple[int, bytes]:
    """``path``'s file handle: its type and bytes (OSError where its file system has none)."""
    buffer = ctypes.create_string_buffer(_HEADER.size + _MAX_HANDLE_SZ)
    _HEADER.pack_into(buffer, 0, _MAX_HANDLE_SZ, 0)
    mount_id = ctypes.c_int()
    if libc().name_to_handle_at(_AT_FDCWD, os.fsencode(path), buffer, ctypes.byref(mount_id), 0):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    size, kind = _HEADER.unpack_from(buffer, 0)
    return kind, buffer.raw[_HEADER.size : _HEADER.size + size]


def open_by_handle(mount_fd: int, kind: int, handle: bytes, flags: int = os.O_RDONLY) -> int:
    """A descriptor of the file ``handle`` (of type ``kind``) names on the file system of
    ``mount_fd``; OSError where there is none (ESTALE: removed) or it may not be opened (EPERM:
    no CAP_DAC_READ_SEARCH)."""
    buffer = ctypes.create_string_buffer(_HEADER.pack(len(handle), kind) + handle)
    fd = int(libc().open_by_handle_at(mount_fd, buffer, flags))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return fd


def kernfs_handle(node_id: int) -> bytes:
    """The handle of kernfs node ``node_id`` (a cgroup's id)."""
    return struct.pack("Q", node_id)
