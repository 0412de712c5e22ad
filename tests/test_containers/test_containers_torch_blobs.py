"""torch.save blobs read in place: the same tensors as torch.load, in the blob's own memory, or None."""

from __future__ import annotations

import gc
import io
import zipfile

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from maxckpt.containers.dcp import DcpReader, DcpWriter
from maxckpt.containers.torch_arrays import to_numpy
from maxckpt.containers.torch_blobs import MemoryFile, tensor_view


def saved(obj) -> memoryview:
    """`torch.save(obj)` as a writable buffer, as DcpReader reads a chunk (numpy-allocated)."""
    out = io.BytesIO()
    torch.save(obj, out)
    buf = np.frombuffer(out.getvalue(), np.uint8).copy()
    return memoryview(buf)


def inside(tensor: torch.Tensor, blob: memoryview) -> bool:
    start = np.frombuffer(blob, np.uint8).ctypes.data
    return start <= tensor.data_ptr() and tensor.data_ptr() + tensor.nbytes <= start + len(blob)


def rewritten(blob: memoryview, *, byteorder: str | None = None, compress: int = zipfile.ZIP_STORED) -> memoryview:
    """The archive written again with the standard zip writer: another byte order mark, or compressed."""
    src, out = zipfile.ZipFile(io.BytesIO(bytes(blob))), io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compress) as dst:
        for info in src.infolist():
            data = src.read(info)
            if byteorder is not None and info.filename.endswith("/byteorder"):
                data = byteorder.encode()
            dst.writestr(info.filename, data)
    return memoryview(np.frombuffer(out.getvalue(), np.uint8).copy())


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(24, dtype=torch.float32).reshape(4, 6),
        lambda: (torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7).to(torch.bfloat16),
        lambda: torch.arange(24, dtype=torch.float16).reshape(4, 6).t(),  # strides kept, not made contiguous
        lambda: torch.arange(30, dtype=torch.int64)[5:17].reshape(3, 4),  # a view: the whole storage is saved
        lambda: torch.tensor([True, False, True]),
        lambda: torch.tensor(3.5, dtype=torch.float64),
    ],
    ids=["float32", "bfloat16", "transposed", "offset-view", "bool", "scalar"],
)
def test_view_equals_torch_load_and_lives_in_the_blob(make):
    tensor = make()
    blob = saved(tensor)
    view = tensor_view(blob)
    loaded = torch.load(MemoryFile(blob), weights_only=True)
    assert view is not None and view.dtype == loaded.dtype and view.shape == loaded.shape
    assert view.stride() == loaded.stride()
    assert torch.equal(view, loaded) and torch.equal(view, tensor)
    assert inside(view, blob)  # no copy: the bytes are the blob's own


def test_the_view_keeps_its_buffer_alive():
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    view = to_numpy(tensor_view(saved(tensor)))  # nothing else holds the buffer
    gc.collect()
    junk = [np.full(1 << 20, 7, np.float32) for _ in range(16)]  # would reuse freed memory
    assert np.array_equal(view, tensor.numpy()) and len(junk) == 16


def test_foreign_byte_order_compression_and_non_tensors_are_left_to_torch():
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    blob = saved(tensor)
    swapped = rewritten(blob, byteorder="big")
    assert tensor_view(swapped) is None
    # torch.load swaps a big-endian archive's bytes, which a view could not.
    swapped_back = torch.from_numpy(tensor.numpy().byteswap())
    assert torch.equal(torch.load(MemoryFile(swapped), weights_only=True), swapped_back)
    assert tensor_view(rewritten(blob, compress=zipfile.ZIP_DEFLATED)) is None
    # Another zip writer's archive is found where it puts the record (byte-sized elements: any offset aligns).
    small = torch.arange(12, dtype=torch.uint8)
    assert torch.equal(tensor_view(rewritten(saved(small))), small)
    assert tensor_view(rewritten(blob)) is None or torch.equal(tensor_view(rewritten(blob)), tensor)
    assert tensor_view(saved({"a": tensor, "b": tensor * 2})) is None
    legacy = io.BytesIO()
    torch.save(tensor, legacy, _use_new_zipfile_serialization=False)  # not a zip archive at all
    assert tensor_view(memoryview(np.frombuffer(legacy.getvalue(), np.uint8).copy())) is None
    assert tensor_view(saved(torch.zeros(0, 4))) is None


def test_a_record_shorter_than_its_storage_is_not_viewed():
    blob = saved(torch.arange(1024, dtype=torch.float32))
    src, out = zipfile.ZipFile(io.BytesIO(bytes(blob))), io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info.filename, data[:-4] if "/data/" in info.filename else data)
    short = memoryview(np.frombuffer(out.getvalue(), np.uint8).copy())
    assert tensor_view(short) is None
    with pytest.raises(RuntimeError):  # and torch's own load refuses it too
        torch.load(MemoryFile(short), weights_only=True)


def test_dcp_chunks_are_read_in_place(tmp_path, monkeypatch):
    """A chunk of a DCP written by torch itself comes back equal, in the buffer it was read into."""
    state = {"w": torch.randn(64, 32), "b": torch.randn(16).to(torch.bfloat16)}
    dcp.save(state, checkpoint_id=str(tmp_path / "torch"), no_dist=True)
    with DcpWriter(tmp_path / "ours") as w:
        w.write("w", state["w"].numpy())
    buffers: list[memoryview] = []
    blob = DcpReader._blob

    def spy(self, chunk, name):
        buffers.append(blob(self, chunk, name))
        return buffers[-1]

    monkeypatch.setattr(DcpReader, "_blob", spy)
    for folder, names in ((tmp_path / "torch", ("w", "b")), (tmp_path / "ours", ("w",))):
        reader = DcpReader(folder)
        for name in names:
            got = reader.read_chunk(name, 0)
            want = state[name]
            assert np.array_equal(got.view(np.uint16) if want.dtype == torch.bfloat16 else got,
                                  want.view(torch.int16).numpy().view(np.uint16) if want.dtype == torch.bfloat16 else want.numpy())
            assert np.shares_memory(got.view(np.uint8).reshape(-1), np.frombuffer(buffers[-1], np.uint8))
