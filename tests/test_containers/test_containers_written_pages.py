"""Files TensorStore finished writing leave the page cache (see maxckpt.containers.written_pages), data intact."""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

from maxckpt.containers.orbax import OrbaxReader, OrbaxWriter
from maxckpt.containers.written_pages import WrittenPages

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def cached_bytes(path) -> int:
    """Bytes of `path` in the page cache, asked of the kernel with mincore (no tool needed)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = ctypes.create_string_buffer(pages)
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw) * mmap.PAGESIZE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def write_file(path, data: bytes, durable: bool = True) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if durable:
            os.fsync(f.fileno())


def test_the_pages_of_durable_files_are_dropped_and_their_bytes_stay(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    write_file(tmp_path / "a", data)
    write_file(tmp_path / "b", data[: 3 << 20])
    assert cached_bytes(tmp_path / "a") > 0  # a fresh write stays cached: the thing to undo
    pages = WrittenPages(tmp_path, every=4 << 20)
    pages.wrote(1 << 20)
    assert cached_bytes(tmp_path / "a") > 0  # below `every`: no scan yet
    pages.wrote(4 << 20)
    assert cached_bytes(tmp_path / "a") == 0 and cached_bytes(tmp_path / "b") == 0
    assert (tmp_path / "a").read_bytes() == data and (tmp_path / "b").read_bytes() == data[: 3 << 20]


def test_a_file_that_grew_is_dropped_again_and_an_unchanged_one_is_not_asked_twice(tmp_path):
    write_file(tmp_path / "a", b"x" * (1 << 20))
    pages = WrittenPages(tmp_path)
    assert pages.drop() == 1 << 20
    assert pages.drop() == 0
    with open(tmp_path / "a", "ab") as f:
        f.write(b"y" * (1 << 20))
        f.flush()
        os.fsync(f.fileno())
    assert pages.drop() == 2 << 20 and cached_bytes(tmp_path / "a") == 0
    assert (tmp_path / "a").read_bytes() == b"x" * (1 << 20) + b"y" * (1 << 20)


def test_pages_not_yet_on_disk_are_never_lost(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 4 << 20, dtype=np.uint8).tobytes()
    write_file(tmp_path / "dirty", data, durable=False)
    WrittenPages(tmp_path).drop()
    assert (tmp_path / "dirty").read_bytes() == data


def test_a_missing_folder_drops_nothing(tmp_path):
    assert WrittenPages(tmp_path / "not-yet").drop() == 0


def test_a_maxtext_output_is_left_out_of_the_page_cache_and_reads_back_exactly(tmp_path):
    rng = np.random.default_rng(2)
    arrays = {f"params/params/w{i}": rng.standard_normal((1024, 2048)).astype(np.float32) for i in range(3)}  # 8 MiB each
    writer = OrbaxWriter(tmp_path / "out", max_pending_bytes=1)  # every write waited for at once, as under budget
    writer._written.every = 8 << 20
    for name, array in arrays.items():
        writer.write(name, array)
    writer.close()
    data_files = [p for p in (tmp_path / "out" / "0" / "items" / "d").iterdir()]
    assert sum(p.stat().st_size for p in data_files) >= 24 << 20
    # The tensor bytes are gone from the cache; a few pages of B-tree nodes TensorStore reads back may stay.
    assert sum(cached_bytes(p) for p in data_files) <= 64 << 10
    with OrbaxReader(tmp_path / "out") as reader:
        for name, array in arrays.items():
            np.testing.assert_array_equal(reader.read(name), array)
