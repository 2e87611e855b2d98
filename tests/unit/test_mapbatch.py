"""BatchReader against a stand-in for libbcc's bpf_lookup_batch that acts as the kernel's
BPF_MAP_LOOKUP_BATCH does for a hash map (kernel/bpf/hashtab.c, __htab_map_lookup_and_delete_batch):
whole buckets per call, the next bucket as the out token, ENOSPC when a bucket does not fit,
ENOENT once the last bucket is read (with that call's entries counted)."""

from __future__ import annotations

import ctypes
import errno

import pytest

from qpolicy.telemetry.mapbatch import BatchReader, MapBatchError


class Leaf(ctypes.Structure):
    _fields_ = [("launches", ctypes.c_uint64), ("syncs", ctypes.c_uint64)]


class Table:
    Key = ctypes.c_uint64
    Leaf = Leaf
    map_fd = 7


class FakeHash:
    """Buckets of (key, launches); records every call's count."""

    def __init__(self, buckets: list[list[int]], refuse: int = 0) -> None:
        self.buckets = buckets
        self.calls: list[int] = []
        self.refuse = refuse  # errno for every call (a kernel without batch ops)

    def __call__(self, fd, in_token, out_token, keys, leaves, count) -> int:  # type: ignore[no-untyped-def]
        assert fd == 7
        count = ctypes.cast(count, ctypes.POINTER(ctypes.c_uint32)).contents
        out = ctypes.cast(out_token, ctypes.POINTER(ctypes.c_uint32)).contents
        self.calls.append(count.value)
        if self.refuse:
            ctypes.set_errno(self.refuse)
            return -self.refuse
        bucket = (
            0
            if in_token is None
            else ctypes.cast(in_token, ctypes.POINTER(ctypes.c_uint32)).contents.value
        )
        room, done = count.value, 0
        key_array = ctypes.cast(keys, ctypes.POINTER(ctypes.c_uint64))
        leaf_array = ctypes.cast(leaves, ctypes.POINTER(Leaf))
        while bucket < len(self.buckets):
            entries = self.buckets[bucket]
            if len(entries) > room - done:
                if done == 0:
                    ctypes.set_errno(errno.ENOSPC)
                    count.value = 0
                    return -errno.ENOSPC
                break
            for key in entries:
                key_array[done] = key
                leaf_array[done].launches = key * 10
                leaf_array[done].syncs = 1
                done += 1
            bucket += 1
        count.value = done
        out.value = bucket
        if bucket >= len(self.buckets):
            ctypes.set_errno(errno.ENOENT)
            return -errno.ENOENT
        return 0


def read(fake: FakeHash, chunk: int) -> dict[int, int]:
    return {
        int(k.value if hasattr(k, "value") else k): v.launches
        for k, v in BatchReader(Table, fake, chunk).items()
    }


def test_reads_every_entry_across_calls_from_where_the_last_stopped() -> None:
    buckets = [[1, 2], [], [3], [4, 5, 6], [], [7]]
    fake = FakeHash(buckets)
    assert read(fake, chunk=3) == {k: k * 10 for k in range(1, 8)}
    assert len(fake.calls) > 1  # it went on from the token, not from the start


def test_one_call_where_the_map_fits() -> None:
    fake = FakeHash([[1], [2], [3]])
    assert read(fake, chunk=256) == {1: 10, 2: 20, 3: 30}
    assert fake.calls == [256]


def test_an_empty_map_reads_empty() -> None:
    assert read(FakeHash([[], []]), chunk=4) == {}


def test_a_bucket_larger_than_the_buffer_grows_it() -> None:
    fake = FakeHash([[1], list(range(10, 19)), [2]])
    assert read(fake, chunk=2) == {1: 10, 2: 20, **{k: k * 10 for k in range(10, 19)}}
    assert max(fake.calls) >= 9


def test_what_was_read_stays_when_the_map_is_read_again() -> None:
    fake = FakeHash([[1], [2]])
    reader = BatchReader(Table, fake, 4)
    first = reader.items()
    fake.buckets = [[3], [4]]
    second = reader.items()
    assert [v.launches for _, v in first] == [10, 20]  # copies, not views of the buffer
    assert [v.launches for _, v in second] == [30, 40]


def test_a_kernel_without_batch_ops_raises() -> None:
    with pytest.raises(MapBatchError):
        BatchReader(Table, FakeHash([[1]], refuse=errno.EINVAL), 4).items()
