"""Large tensor writes go to the disk with O_DIRECT, their unaligned edges through the page cache, and the
files are byte for byte what ordinary writes make; where O_DIRECT is refused, everything is written the
ordinary way, and a real write error still fails the write."""

from __future__ import annotations

import errno
import fcntl
import os

import ml_dtypes
import numpy as np
import pytest
import torch

from maxckpt.containers import direct_io
from maxckpt.containers.direct_io import ALIGN, MIN_DIRECT, DirectWrites
from maxckpt.containers.safetensors import SafetensorsReader, SafetensorsWriter
from maxckpt.tensors import TensorInfo


@pytest.fixture
def direct_bytes(monkeypatch) -> list[int]:
    """Bytes each direct write put on the disk, across every writer of the test."""
    written: list[int] = []
    real = DirectWrites._write_direct

    def spy(self, view, offset):
        done = real(self, view, offset)
        written.append(done)
        return done

    monkeypatch.setattr(DirectWrites, "_write_direct", spy)
    return written


def _flags(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETFL)


def _tensors() -> dict[str, np.ndarray]:
    """Sizes and dtypes that put every tensor boundary off the 4 KiB grid."""
    rng = np.random.default_rng(0)
    return {
        "big": rng.standard_normal((1001, 777)).astype(np.float32),  # ~3 MiB: a direct interior
        "tiny": rng.standard_normal(37).astype(np.float32),  # 148 bytes, all through the page cache
        "bf16": rng.standard_normal((513, 1031)).astype(ml_dtypes.bfloat16),  # ~1 MiB, odd rows
        "last": rng.standard_normal((999, 1237)).astype(np.float32),  # ends the file mid-block
    }


def _one_file(tmp_path, data: bytes, offset: int) -> bytes:
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        os.pwrite(fd, b"h" * offset, 0)
        w = DirectWrites(path, fd)
        w.pwrite(data, offset)
        w.close()
        os.fsync(fd)
    finally:
        os.close(fd)
    return path.read_bytes()


@pytest.mark.parametrize("offset", [0, 1, ALIGN - 8, 3 * ALIGN])
def test_a_large_write_lands_whole_at_any_offset(tmp_path, direct_bytes, offset):
    data = np.random.default_rng(1).integers(0, 256, MIN_DIRECT + 3 * ALIGN + 5, dtype=np.uint8).tobytes()
    assert _one_file(tmp_path, data, offset) == b"h" * offset + data
    interior = (offset + len(data)) // ALIGN * ALIGN - -(-offset // ALIGN) * ALIGN
    assert direct_bytes == [interior]  # everything between the first and the last block boundary went direct


def test_a_small_write_and_a_switched_off_one_go_through_the_page_cache(tmp_path, direct_bytes, monkeypatch):
    small = b"s" * (MIN_DIRECT - 1)
    assert _one_file(tmp_path, small, 3) == b"hhh" + small
    monkeypatch.setenv(direct_io.ENV, "0")
    large = b"L" * (4 * MIN_DIRECT)
    assert _one_file(tmp_path, large, 0) == large
    assert direct_bytes == []


def test_a_file_system_that_refuses_o_direct_gets_ordinary_writes(tmp_path, direct_bytes, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_io.os, "open", no_direct)
    data = b"d" * (3 * MIN_DIRECT + 17)
    assert _one_file(tmp_path, data, 5) == b"h" * 5 + data
    assert direct_bytes == []


def test_a_device_that_wants_larger_alignment_gets_the_rest_written_the_ordinary_way(tmp_path, monkeypatch):
    real_pwrite = os.pwrite
    calls = {"direct": 0}

    def picky(fd, data, offset):
        if _flags(fd) & os.O_DIRECT:
            calls["direct"] += 1
            if calls["direct"] > 1:  # the first direct write goes through, the second is refused
                raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct_io.os, "pwrite", picky)
    data = np.random.default_rng(2).integers(0, 256, 3 * direct_io.BOUNCE + 999, dtype=np.uint8).tobytes()
    assert _one_file(tmp_path, data, 100) == b"h" * 100 + data
    assert calls["direct"] == 2


def test_a_disk_error_during_a_direct_write_is_raised(tmp_path, monkeypatch):
    real_pwrite = os.pwrite

    def full(fd, data, offset):
        if _flags(fd) & os.O_DIRECT:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct_io.os, "pwrite", full)
    with pytest.raises(OSError) as err:
        _one_file(tmp_path, b"x" * (2 * MIN_DIRECT), 0)
    assert err.value.errno == errno.ENOSPC


def test_safetensors_files_are_the_same_written_directly_or_not(tmp_path, direct_bytes, monkeypatch):
    tensors = _tensors()
    plan = [TensorInfo(n, a.shape, a.dtype) for n, a in tensors.items()]

    def write(folder):
        w = SafetensorsWriter(folder, plan=plan)
        w.write("big", tensors["big"])
        w.write("tiny", tensors["tiny"])
        w.write_pieces("bf16", tensors["bf16"].shape, tensors["bf16"].dtype, [((i,), tensors["bf16"][i]) for i in range(513)])
        w.write_pieces("last", tensors["last"].shape, np.float32, [((slice(0, 500),), tensors["last"][:500]), ((slice(500, 999),), tensors["last"][500:])])
        w.close()
        return (folder / "model.safetensors").read_bytes()

    direct = write(tmp_path / "direct")
    assert sum(direct_bytes) >= tensors["big"].nbytes - 2 * ALIGN  # the large tensor went to the disk directly
    monkeypatch.setenv(direct_io.ENV, "0")
    assert write(tmp_path / "buffered") == direct
    with SafetensorsReader(tmp_path / "direct") as r:
        for name, array in tensors.items():
            assert np.array_equal(r.read(name).view(np.uint8), array.view(np.uint8)), name


def test_torch_files_and_dcp_load_the_tensors_written_directly(tmp_path, direct_bytes):
    import torch.distributed.checkpoint as dcp

    from maxckpt.containers.dcp import DcpWriter
    from maxckpt.containers.torch_file import TorchFileWriter

    tensors = {n: a for n, a in _tensors().items() if a.dtype == np.float32}
    w = TorchFileWriter(tmp_path / "model.pt")
    for name, array in tensors.items():
        w.write(name, array)
    w.close()
    assert sum(direct_bytes) > 0
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.equal(loaded[n], torch.from_numpy(a)) for n, a in tensors.items())

    direct_bytes.clear()
    with DcpWriter(tmp_path / "dcp") as w:
        for name, array in tensors.items():
            w.write(name, array)
    assert sum(direct_bytes) > 0
    state = {n: torch.empty(a.shape, dtype=torch.float32) for n, a in tensors.items()}
    dcp.load(state, checkpoint_id=str(tmp_path / "dcp"))
    assert all(torch.equal(state[n], torch.from_numpy(a)) for n, a in tensors.items())
