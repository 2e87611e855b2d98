"""A BPF map read whole in batches, into buffers kept from one read to the next.

bcc's ``items_lookup_batch`` allocates key and value arrays for the map's ``max_entries`` at
every read: for the probe's per-cgroup counters (16 384 entries, ~40 used on a GPU host) about
0.14 ms of the 0.36 ms the rm enforcer's loop paid per read of every pod's launch counts, about
ten times a second (an H200, 10 busy pods: BENCHMARKS.md, 2026-12-02, twenty-sixth session).
Here the kernel fills a buffer of ``chunk`` entries, read again from where it stopped
(``BPF_MAP_LOOKUP_BATCH``'s batch token) until the map is done, and the entries found are copied
out into arrays of their own size, so a caller may keep what it was given.
"""

from __future__ import annotations

import ctypes
import errno
from typing import Any

# Entries per batch call. A hash bucket holding more entries than a call may return makes the
# kernel answer ENOSPC; the buffer then doubles and the call is repeated.
CHUNK = 256
MAX_CHUNK = 1 << 16


class MapBatchError(OSError):
    """The kernel refused a batch lookup (no BPF_MAP_LOOKUP_BATCH: before 5.6)."""


class BatchReader:
    """Reads one bcc table whole with ``BPF_MAP_LOOKUP_BATCH``."""

    def __init__(self, table: Any, lookup_batch: Any, chunk: int = CHUNK) -> None:
        self._fd = table.map_fd
        self._key_type = table.Key
        self._leaf_type = table.Leaf
        self._batch = lookup_batch  # libbcc's bpf_lookup_batch
        self._size(chunk)

    def _size(self, chunk: int) -> None:
        self._chunk = chunk
        self._keys = (self._key_type * chunk)()
        self._leaves = (self._leaf_type * chunk)()

    def items(self) -> list[tuple[Any, Any]]:
        """Every (key, value) of the map, copied: valid after the next read."""
        key_size = ctypes.sizeof(self._key_type)
        leaf_size = ctypes.sizeof(self._leaf_type)
        in_token = ctypes.c_uint32(0)
        out_token = ctypes.c_uint32(0)
        count = ctypes.c_uint32(0)
        keys: list[bytes] = []
        leaves: list[bytes] = []
        first = True
        while True:
            count.value = self._chunk
            res = self._batch(
                self._fd,
                None if first else ctypes.byref(in_token),
                ctypes.byref(out_token),
                self._keys,
                self._leaves,
                ctypes.byref(count),
            )
            err = ctypes.get_errno() if res != 0 else 0
            if res != 0 and err == errno.ENOSPC and self._chunk < MAX_CHUNK:
                self._size(self._chunk * 2)  # a bucket larger than the buffer: again, larger
                continue
            if res != 0 and err != errno.ENOENT:
                raise MapBatchError(err, f"BPF_MAP_LOOKUP_BATCH: {errno.errorcode.get(err, err)}")
            found = count.value
            if found:
                keys.append(ctypes.string_at(self._keys, found * key_size))
                leaves.append(ctypes.string_at(self._leaves, found * leaf_size))
            if res != 0 or found == 0:
                break  # ENOENT: the map is done (with this call's entries, if any)
            first = False
            in_token.value = out_token.value
        key_bytes, leaf_bytes = b"".join(keys), b"".join(leaves)
        total = len(key_bytes) // key_size
        if total == 0:
            return []
        out_keys = (self._key_type * total).from_buffer_copy(key_bytes)
        out_leaves = (self._leaf_type * total).from_buffer_copy(leaf_bytes)
        return list(zip(out_keys, out_leaves, strict=True))
