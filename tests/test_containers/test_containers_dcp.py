"""PyTorch DCP container: lazy listing and reading, streaming writes stock DCP loads, hostile input."""

from __future__ import annotations

import io
import os
import pickle

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from maxckpt.containers.base import TensorReader, TensorWriter
from maxckpt.containers.dcp import DcpReader, DcpWriter, load_metadata
from maxckpt.errors import CheckpointNotFoundError, CorruptCheckpointError, ShapeMismatchError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RNG = np.random.default_rng(0)
STACKED = RNG.standard_normal((3, 4, 5)).astype(ml_dtypes.bfloat16)
PLAIN = RNG.standard_normal((6, 2)).astype(np.float32)
IDS = np.arange(7, dtype=np.int64)


def _write(path) -> None:
    with DcpWriter(path) as w:
        w.write_pieces("decoder.layers.w", STACKED.shape, STACKED.dtype, (((i,), STACKED[i]) for i in range(3)))
        w.write("embedding.weight", PLAIN)
        w.write("ids", IDS)
        w.write("train_state.step", np.array(11, dtype=np.int64), path=("train_state", "step"))
        w.write_object("layer._extra_state/shard_0_1", [None])


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a


def test_reader_and_writer_follow_the_container_protocols(tmp_path):
    _write(tmp_path / "ck")
    assert isinstance(DcpReader(tmp_path / "ck"), TensorReader)
    assert isinstance(DcpWriter(tmp_path / "other"), TensorWriter)


def test_listing_comes_from_metadata_with_one_chunk_per_layer(tmp_path):
    _write(tmp_path / "ck")
    r = DcpReader(tmp_path / "ck")
    infos = r.tensors()
    assert set(infos) == {"decoder.layers.w", "embedding.weight", "ids", "train_state.step"}
    assert infos["decoder.layers.w"].shape == (3, 4, 5)
    assert infos["decoder.layers.w"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert infos["decoder.layers.w"].chunk_shape == (1, 4, 5)
    assert [c.offsets for c in r.chunks("decoder.layers.w")] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    assert r.objects() == ["layer._extra_state/shard_0_1"]
    assert r.read_object("layer._extra_state/shard_0_1") == [None]


@pytest.mark.parametrize(
    "index",
    [None, (1,), (slice(None), 2), (slice(0, 3, 2), slice(1, 4), 3), (-1, slice(None, None, 2))],
)
def test_reads_whole_tensors_and_slices_exactly(tmp_path, index):
    _write(tmp_path / "ck")
    r = DcpReader(tmp_path / "ck")
    expected = STACKED if index is None else STACKED[index]
    got = r.read("decoder.layers.w", index)
    assert got.shape == expected.shape
    assert np.array_equal(_bits(got), _bits(expected))


def test_reading_one_layer_loads_only_that_layers_chunk(tmp_path, monkeypatch):
    _write(tmp_path / "ck")
    r = DcpReader(tmp_path / "ck")
    loaded = []
    original = r.read_chunk
    monkeypatch.setattr(r, "read_chunk", lambda name, i: loaded.append(i) or original(name, i))
    r.read("decoder.layers.w", (2,))
    assert loaded == [2]


def test_stock_dcp_load_without_process_group(tmp_path):
    _write(tmp_path / "ck")
    sd = {
        "decoder.layers.w": torch.zeros(3, 4, 5, dtype=torch.bfloat16),
        "embedding.weight": torch.zeros(6, 2),
        "ids": torch.zeros(7, dtype=torch.int64),
        "train_state": {"step": torch.tensor(0)},
        "layer._extra_state/shard_0_1": None,
    }
    dcp.load(sd, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    assert torch.equal(sd["decoder.layers.w"].view(torch.uint16), torch.from_numpy(STACKED.view(np.uint16)))
    assert torch.equal(sd["embedding.weight"], torch.from_numpy(PLAIN))
    assert torch.equal(sd["ids"], torch.from_numpy(IDS))
    assert int(sd["train_state"]["step"]) == 11
    assert sd["layer._extra_state/shard_0_1"] == [None]


def test_stock_dcp_load_with_a_gloo_process_group(tmp_path):
    _write(tmp_path / "ck")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        sd = {"decoder.layers.w": torch.zeros(3, 4, 5, dtype=torch.bfloat16), "embedding.weight": torch.zeros(6, 2)}
        dcp.load(sd, checkpoint_id=str(tmp_path / "ck"))
    finally:
        dist.destroy_process_group()
    assert torch.equal(sd["decoder.layers.w"].view(torch.uint16), torch.from_numpy(STACKED.view(np.uint16)))
    assert torch.equal(sd["embedding.weight"], torch.from_numpy(PLAIN))


def test_dcp_to_torch_save_rebuilds_the_nesting_from_planner_paths(tmp_path):
    _write(tmp_path / "ck")
    dcp_to_torch_save(tmp_path / "ck", tmp_path / "all.pt")
    sd = torch.load(tmp_path / "all.pt", weights_only=False)
    assert int(sd["train_state"]["step"]) == 11
    assert "decoder.layers.w" in sd  # flat keys with dots stay flat


def test_reads_what_stock_dcp_save_writes(tmp_path):
    sd = {"model": {"a.weight": torch.arange(12.0).reshape(3, 4)}, "blob": io.BytesIO(b"xyz"), "n": 5}
    dcp.save(sd, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    r = DcpReader(tmp_path / "ck")
    assert r.read("model.a.weight").tolist() == np.arange(12.0).reshape(3, 4).tolist()
    assert r.planner_path("model.a.weight") == ("model", "a.weight")
    assert r.read_object("n") == 5
    with pytest.raises(CorruptCheckpointError, match="read_bytes"):
        r.read_object("blob")  # a pickled BytesIO needs arbitrary classes: refused
    assert b"xyz" in r.read_bytes("blob")


def test_globals_other_libraries_register_do_not_widen_what_is_loaded(tmp_path):
    """megatron-core registers io.BytesIO (and more) as torch-safe on import; maxckpt's reads keep torch's own list."""
    sd = {"blob": io.BytesIO(b"xyz"), "n": 5}
    dcp.save(sd, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([io.BytesIO])
    try:
        r = DcpReader(tmp_path / "ck")
        assert r.read_object("n") == 5
        with pytest.raises(CorruptCheckpointError, match="read_bytes"):
            r.read_object("blob")
        assert io.BytesIO in torch.serialization.get_safe_globals()  # the process's registry is as it was
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_metadata_is_refused_without_running_code(tmp_path):
    _write(tmp_path / "ck")
    marker = tmp_path / "pwned"
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(_RunsCode(str(marker))))
    with pytest.raises(CorruptCheckpointError, match=r"refused to load: global '(posix|os)\.system'"):
        DcpReader(tmp_path / "ck")
    assert not marker.exists()


def _tamper(md, how: str) -> None:
    """Edit one stored entry of `embedding.weight` the way a hostile or damaged `.metadata` would."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    key = next(k for k in md.storage_data if k.fqn == "embedding.weight")
    info = md.storage_data[key]
    item = md.state_dict_metadata["embedding.weight"]
    if how == "outside-the-directory":
        md.storage_data[key] = _StorageInfo("../elsewhere/__0_0.distcp", info.offset, info.length)
    elif how == "negative-offset":
        md.storage_data[key] = _StorageInfo(info.relative_path, -8, info.length)
    elif how == "length-beyond-the-file":
        md.storage_data[key] = _StorageInfo(info.relative_path, info.offset, 2**50)
    elif how == "huge-tensor":
        item.size = torch.Size([2**40, 2**20])
    elif how == "chunk-bigger-than-its-bytes":
        item.size = torch.Size([2**20, 2**20])
        item.chunks = [ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2**20, 2**20]))]
    elif how == "chunk-outside-the-tensor":
        item.chunks = [ChunkStorageMetadata(offsets=torch.Size([5, 0]), sizes=torch.Size([6, 2]))]
        md.storage_data[MetadataIndex("embedding.weight", torch.Size([5, 0]))] = md.storage_data.pop(key)
    elif how == "wrong-types":
        item.chunks = 5


@pytest.mark.parametrize(
    "how, message",
    [
        ("outside-the-directory", r"stored at file '\.\./elsewhere/__0_0\.distcp'.*corrupt or hostile"),
        ("negative-offset", r"bytes \[-8, .*corrupt or hostile"),
        ("length-beyond-the-file", r"truncated: item 'embedding.weight' needs bytes"),
        ("huge-tensor", r"cover 12 of the \d+ requested elements"),
        ("chunk-bigger-than-its-bytes", r"fewer than the 4398046511104 its \[1048576, 1048576\] elements need"),
        ("chunk-outside-the-tensor", r"chunk at offsets \(5, 0\) of sizes \(6, 2\), outside the tensor"),
        ("wrong-types", r"malformed DCP metadata \(TypeError"),
    ],
)
def test_stated_sizes_and_places_are_checked_before_anything_is_allocated_or_read(tmp_path, how, message):
    _write(tmp_path / "ck")
    md = load_metadata(tmp_path / "ck")
    _tamper(md, how)
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(CorruptCheckpointError, match=message):
        DcpReader(tmp_path / "ck").read("embedding.weight")


def test_a_pickle_length_field_claiming_exabytes_is_corrupt_not_a_crash(tmp_path):
    (tmp_path / "ck").mkdir()
    # BINBYTES8 with a length of 2**62 and three bytes of data.
    (tmp_path / "ck" / ".metadata").write_bytes(b"\x80\x04\x8e" + (2**62).to_bytes(8, "little") + b"abc")
    with pytest.raises(CorruptCheckpointError, match="not a readable DCP metadata pickle"):
        load_metadata(tmp_path / "ck")


def test_megatron_mcore_metadata_subclass_reads_as_plain_metadata(tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    _write(tmp_path / "ck")
    md = load_metadata(tmp_path / "ck")
    md.mcore_data = {}
    # The same metadata as older Megatron-Core pickled it: as its MCoreMetadata subclass.
    data = pickle.dumps(md, protocol=2)
    ours = b"ctorch.distributed.checkpoint.metadata\nMetadata\n"
    assert data.count(ours) == 1
    data = data.replace(ours, b"cmegatron.core.dist_checkpointing.strategies.torch\nMCoreMetadata\n")
    (tmp_path / "ck" / ".metadata").write_bytes(data)
    r = DcpReader(tmp_path / "ck")
    assert type(r.metadata) is Metadata
    assert np.array_equal(r.read("embedding.weight"), PLAIN)


def test_truncated_distcp_gives_a_clear_error(tmp_path):
    _write(tmp_path / "ck")
    data = tmp_path / "ck" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    r = DcpReader(tmp_path / "ck")  # metadata alone is intact
    with pytest.raises(CorruptCheckpointError, match=r"__0_0\.distcp: truncated: item 'ids' needs bytes"):
        r.read("ids")


def test_garbage_blob_gives_a_clear_error(tmp_path):
    _write(tmp_path / "ck")
    data = tmp_path / "ck" / "__0_0.distcp"
    data.write_bytes(b"\0" * data.stat().st_size)
    with pytest.raises(CorruptCheckpointError, match="not a readable torch.save blob"):
        DcpReader(tmp_path / "ck").read("embedding.weight")


def test_missing_metadata_is_not_a_checkpoint(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(CheckpointNotFoundError, match=r"\.metadata is missing"):
        DcpReader(tmp_path / "d")


def test_pieces_must_tile_the_tensor_exactly_once(tmp_path):
    w = DcpWriter(tmp_path / "ck")
    with pytest.raises(ShapeMismatchError, match="cover 4 of 6"):
        w.write_pieces("a", (3, 2), np.float32, [((0,), np.zeros(2, np.float32)), ((1,), np.zeros(2, np.float32))])
    with pytest.raises(ShapeMismatchError, match="overlaps"):
        w.write_pieces("b", (2, 2), np.float32, [((0,), np.zeros(2, np.float32)), ((0,), np.zeros(2, np.float32))])
    w.write("c", PLAIN)  # the writer stays usable; failed items never reach the metadata
    w.close()
    assert set(DcpReader(tmp_path / "ck").tensors()) == {"c"}


def test_a_failed_write_leaves_no_metadata(tmp_path):
    with pytest.raises(RuntimeError):
        with DcpWriter(tmp_path / "ck") as w:
            w.write("a", PLAIN)
            raise RuntimeError("conversion failed")
    assert not (tmp_path / "ck" / ".metadata").exists()
