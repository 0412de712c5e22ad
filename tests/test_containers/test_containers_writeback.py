"""Writers start the disk on each tensor's bytes as soon as they are written, so the final fsync has little left.

Without it the kernel writes nothing back until a tenth of memory is dirty,
and a conversion's closing fsync waited for the whole output (0.6-0.8 s of a
2 GB conversion on the 2-core VM). Each writer hands exactly the byte
ranges it wrote to `maxckpt.libc.start_writeback` (Linux `sync_file_range`).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from maxckpt import libc
from maxckpt.containers.safetensors import SafetensorsWriter, read_header
from maxckpt.tensors import TensorInfo


@pytest.fixture
def started(monkeypatch) -> list[tuple[str, int, int]]:
    """The (file, offset, length) ranges writers ask the kernel to write back, still passed on to it."""
    calls: list[tuple[str, int, int]] = []
    real = libc.start_writeback

    def spy(fd: int, offset: int, nbytes: int) -> bool:
        calls.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), offset, nbytes))
        return real(fd, offset, nbytes)

    monkeypatch.setattr(libc, "start_writeback", spy)
    return calls


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"a": rng.standard_normal((64, 128)).astype(np.float32), "b": rng.standard_normal((3, 4096)).astype(np.float32)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_kernel_takes_a_writeback_request(tmp_path):
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"x" * (1 << 20))
        assert libc.start_writeback(fd, 0, 1 << 20) is True
        assert libc.start_writeback(fd, 0, 0) is False  # nothing to write: no call
    finally:
        os.close(fd)


def test_safetensors_writes_back_each_tensors_own_bytes(tmp_path, started):
    tensors = _tensors()
    w = SafetensorsWriter(tmp_path, plan=[TensorInfo(n, a.shape, a.dtype) for n, a in tensors.items()])
    w.write("a", tensors["a"])
    w.write_pieces("b", (3, 4096), np.float32, [((i,), tensors["b"][i]) for i in range(3)])
    w.close()
    entries, _ = read_header(tmp_path / "model.safetensors")
    assert sorted(started) == sorted(("model.safetensors", e.begin, e.end - e.begin) for e in entries.values())


def test_dcp_and_torch_files_write_back_every_byte_of_their_tensors(tmp_path, started):
    from maxckpt.containers.dcp import DcpWriter
    from maxckpt.containers.torch_file import TorchFileWriter

    tensors = _tensors()
    with DcpWriter(tmp_path / "dcp") as w:
        for name, array in tensors.items():
            w.write(name, array)
    dcp = sorted((o, n) for f, o, n in started if f.endswith(".distcp"))
    size = os.path.getsize(next((tmp_path / "dcp").glob("*.distcp")))
    # One range per chunk, back to back from the start: the whole data file.
    assert len(dcp) == 2 and dcp[0][0] == 0 and dcp[1][0] == sum(dcp[0]) and sum(dcp[1]) == size

    started.clear()
    w = TorchFileWriter(tmp_path / "model.pt")
    for name, array in tensors.items():
        w.write(name, array)
    w.close()
    assert len(started) == 2 and all(n >= tensors[k].nbytes for (_, _, n), k in zip(started, tensors))
