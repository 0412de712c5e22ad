"""safetensors container: interoperable files, sharding, lazy slices, and hostile input rejected clearly."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from maxckpt.containers.safetensors import INDEX_FILE, SafetensorsReader, SafetensorsWriter
from maxckpt.units import parse_size
from maxckpt.errors import ConversionError, CorruptCheckpointError
from maxckpt.tensors import TensorInfo


def tensors():
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.standard_normal((6, 4)).astype(np.float32),
        "b.weight": rng.standard_normal((8, 4)).astype(ml_dtypes.bfloat16),
        "c.bias": np.arange(5, dtype=np.int64),
        "d.scale": rng.standard_normal(3).astype(np.float16),
    }


def plan(ts):
    return [TensorInfo(n, a.shape, a.dtype) for n, a in ts.items()]


@pytest.mark.parametrize("planned", [True, False], ids=["streamed", "buffered"])
def test_single_file_is_readable_by_the_safetensors_library(tmp_path, planned):
    ts = tensors()
    w = SafetensorsWriter(tmp_path, plan=plan(ts) if planned else None)
    for n, a in ts.items():
        w.write(n, a)
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    with safe_open(tmp_path / "model.safetensors", "np") as f:
        assert f.metadata() == {"format": "pt"}
        for n, a in ts.items():
            if a.dtype == np.dtype(ml_dtypes.bfloat16):
                continue  # safetensors' numpy API has no bfloat16; compared below through our reader
            assert np.array_equal(f.get_tensor(n), a)
    r = SafetensorsReader(tmp_path)
    assert {n: (i.shape, i.dtype) for n, i in r.tensors().items()} == {n: (a.shape, a.dtype) for n, a in ts.items()}
    for n, a in ts.items():
        assert np.array_equal(r.read(n), a)


def test_reader_reads_files_written_by_the_safetensors_library(tmp_path):
    ts = {k: v for k, v in tensors().items() if v.dtype != np.dtype(ml_dtypes.bfloat16)}
    save_file(ts, str(tmp_path / "x.safetensors"))
    r = SafetensorsReader(tmp_path / "x.safetensors")
    for n, a in ts.items():
        assert np.array_equal(r.read(n), a)


def test_sharded_output_follows_hf_names_and_index(tmp_path):
    ts = tensors()
    w = SafetensorsWriter(tmp_path, max_shard_size=100, plan=plan(ts))
    for n, a in ts.items():
        w.write(n, a)
    w.close()
    # 96 B + 64 B > 100: every tensor in order gets a shard; c.bias (40 B) + d.scale (6 B) share one.
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([INDEX_FILE, "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"])
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in ts.values())
    assert index["weight_map"] == {
        "a.weight": "model-00001-of-00003.safetensors",
        "b.weight": "model-00002-of-00003.safetensors",
        "c.bias": "model-00003-of-00003.safetensors",
        "d.scale": "model-00003-of-00003.safetensors",
    }
    assert np.array_equal(load_file(str(tmp_path / "model-00003-of-00003.safetensors"))["c.bias"], ts["c.bias"])
    r = SafetensorsReader(tmp_path)
    for n, a in ts.items():
        assert np.array_equal(r.read(n), a)


def test_buffered_and_streamed_writers_produce_identical_shards(tmp_path):
    ts = tensors()
    for mode in ("streamed", "buffered"):
        w = SafetensorsWriter(tmp_path / mode, max_shard_size=100, plan=plan(ts) if mode == "streamed" else None)
        for n, a in ts.items():
            w.write(n, a)
        w.close()
    for f in (tmp_path / "streamed").iterdir():
        assert f.read_bytes() == (tmp_path / "buffered" / f.name).read_bytes()


def test_streamed_writer_puts_each_tensor_on_disk_as_it_comes(tmp_path):
    ts = tensors()
    w = SafetensorsWriter(tmp_path, plan=plan(ts))
    w.write("a.weight", ts["a.weight"])
    data = (tmp_path / "model.safetensors").read_bytes()
    assert ts["a.weight"].tobytes() in data  # written before close(), nothing buffered
    with pytest.raises(ConversionError, match="never written"):
        w.close()


def test_pieces_along_the_leading_axis_stream_into_place(tmp_path):
    whole = np.arange(24, dtype=np.float32).reshape(4, 6)
    w = SafetensorsWriter(tmp_path, plan=[TensorInfo("s", whole.shape, whole.dtype)])
    w.write_pieces("s", whole.shape, whole.dtype, [((i,), whole[i]) for i in (2, 0, 3, 1)])
    w.close()
    assert np.array_equal(SafetensorsReader(tmp_path).read("s"), whole)
    # pieces on another axis are assembled, still exactly
    w = SafetensorsWriter(tmp_path / "cols", plan=[TensorInfo("s", whole.shape, whole.dtype)])
    w.write_pieces("s", whole.shape, whole.dtype, [((slice(None), j), whole[:, j]) for j in range(6)])
    w.close()
    assert np.array_equal(SafetensorsReader(tmp_path / "cols").read("s"), whole)


def test_reader_reads_leading_rows_and_slices(tmp_path):
    a = np.arange(60, dtype=np.float32).reshape(5, 3, 4)
    save_file({"a": a}, str(tmp_path / "m.safetensors"))
    r = SafetensorsReader(tmp_path / "m.safetensors")
    assert np.array_equal(r.read("a", (slice(1, 3),)), a[1:3])
    assert np.array_equal(r.read("a", (4,)), a[4])
    assert np.array_equal(r.read("a", (-1, slice(None), 2)), a[-1, :, 2])
    assert np.array_equal(r.read("a", (slice(None, None, 2), 1)), a[::2, 1])
    assert np.array_equal(r.read("a", (slice(None), slice(1, 2))), a[:, 1:2])
    assert np.array_equal(r.read("a", (slice(None, None, -2), 0)), a[::-2, 0])
    assert r.read("a", (slice(3, 3),)).shape == (0, 3, 4)
    assert np.array_equal(r.read("a"), a)


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size(123) == 123
    with pytest.raises(ConversionError, match="5GB"):
        parse_size("five gigs")


# ------------------------------------------------------------ hostile input


def write_raw(path: Path, header: dict, data: bytes, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def test_truncated_file_is_corrupt(tmp_path):
    save_file({"a": np.zeros((64, 64), np.float32)}, str(tmp_path / "m.safetensors"))
    data = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "m.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(CorruptCheckpointError, match=r"tensor 'a' ends at byte \d+ but the file has \d+ bytes \(truncated"):
        SafetensorsReader(tmp_path)
    (tmp_path / "m.safetensors").write_bytes(data[:5])
    with pytest.raises(CorruptCheckpointError, match="too short"):
        SafetensorsReader(tmp_path)


def test_huge_header_length_is_rejected_before_reading(tmp_path):
    f = write_raw(tmp_path / "m.safetensors", {}, b"", length=2**62)
    with pytest.raises(CorruptCheckpointError, match=r"header claims \d+ bytes but the file has"):
        SafetensorsReader(f)


def test_overlapping_offsets_are_rejected(tmp_path):
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }
    f = write_raw(tmp_path / "m.safetensors", header, bytes(24))
    with pytest.raises(CorruptCheckpointError, match="'a' .* and 'b' .* overlap"):
        SafetensorsReader(f)


def test_out_of_range_and_inconsistent_entries_are_rejected(tmp_path):
    f = write_raw(tmp_path / "m.safetensors", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, bytes(16))
    with pytest.raises(CorruptCheckpointError, match=r"spans bytes \[0, 12\) but F32\[4\] needs 16"):
        SafetensorsReader(f)
    f = write_raw(tmp_path / "n.safetensors", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [100, 116]}}, bytes(16))
    with pytest.raises(CorruptCheckpointError, match="ends at byte"):
        SafetensorsReader(f)
    f = write_raw(tmp_path / "o.safetensors", {"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}}, bytes(2))
    with pytest.raises(CorruptCheckpointError, match="unsupported dtype 'Q4'"):
        SafetensorsReader(f)
    (tmp_path / "p.safetensors").write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        SafetensorsReader(tmp_path / "p.safetensors")


@pytest.mark.parametrize(
    "shape, offsets",
    [
        ([2**62, 4], [0, 0]),  # 2**64 bytes: wraps to 0 in int64 arithmetic, matching the empty range
        (["2", 1.7], [0, 8]),  # dimensions must be integers, not strings or floats
        ([True, 2], [0, 8]),
        ([2, 2], [0.0, 16]),
    ],
)
def test_shapes_and_offsets_must_be_integers_whose_bytes_match(tmp_path, shape, offsets):
    f = write_raw(tmp_path / "m.safetensors", {"a": {"dtype": "F32", "shape": shape, "data_offsets": offsets}}, bytes(16))
    with pytest.raises(CorruptCheckpointError, match="tensor 'a' (spans bytes|has a malformed header entry)"):
        SafetensorsReader(f)


@pytest.mark.parametrize("target", [3, None, "../elsewhere/model.safetensors", "/etc/passwd"])
def test_index_may_only_name_files_in_its_directory(tmp_path, target):
    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "model-00001-of-00001.safetensors"))
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"a": target}}))
    with pytest.raises(CorruptCheckpointError, match=f"{INDEX_FILE}: not a valid safetensors index"):
        SafetensorsReader(tmp_path)


def test_index_entries_must_match_the_shards(tmp_path):
    ts = tensors()
    w = SafetensorsWriter(tmp_path, max_shard_size=100, plan=plan(ts))
    for n, a in ts.items():
        w.write(n, a)
    w.close()
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    del index["weight_map"]["c.bias"]
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CorruptCheckpointError, match="tensor 'c.bias' is stored but missing from the index"):
        SafetensorsReader(tmp_path)
    index["weight_map"]["c.bias"] = "model-00001-of-00003.safetensors"
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CorruptCheckpointError, match="maps 'c.bias' to model-00001-of-00003.safetensors, but that file has no such tensor"):
        SafetensorsReader(tmp_path)
    index["weight_map"]["c.bias"] = "model-00009-of-00009.safetensors"
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CorruptCheckpointError, match="lists model-00009-of-00009.safetensors, which does not exist"):
        SafetensorsReader(tmp_path)
