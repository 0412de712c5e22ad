"""Plain torch.save container: streaming single-file and sharded writes, safe lazy reads."""

from __future__ import annotations

import json
import os
import pickle

import ml_dtypes
import numpy as np
import pytest
import torch

from maxckpt.containers.base import TensorReader, TensorWriter
from maxckpt.containers.torch_file import INDEX_FILE, SINGLE_FILE, TorchFileReader, TorchFileWriter
from maxckpt.errors import CorruptCheckpointError, UnsupportedModelError

RNG = np.random.default_rng(1)
ARRAYS = {
    "a.weight": RNG.standard_normal((8, 4)).astype(ml_dtypes.bfloat16),
    "b.weight": RNG.standard_normal((16, 4)).astype(np.float32),
    "c.ids": np.arange(5, dtype=np.int64),
    "d.scalar": np.array(2.5, dtype=np.float32),
}


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a


def _write(path, **kw) -> None:
    with TorchFileWriter(path, **kw) as w:
        for k, v in ARRAYS.items():
            w.write(k, v)


def test_single_file_is_what_torch_load_reads_with_weights_only_and_mmap(tmp_path):
    _write(tmp_path / "model.pt")
    for mmap in (False, True):
        sd = torch.load(tmp_path / "model.pt", weights_only=True, mmap=mmap)
        assert list(sd) == list(ARRAYS)
        assert sd["a.weight"].dtype == torch.bfloat16
        for k, v in ARRAYS.items():
            assert np.array_equal(_bits(sd[k].view(torch.uint16).numpy() if k == "a.weight" else sd[k].numpy()), _bits(v))


def test_reader_lists_and_reads_slices(tmp_path):
    _write(tmp_path / "model.pt")
    r = TorchFileReader(tmp_path / "model.pt")
    assert isinstance(r, TensorReader)
    infos = r.tensors()
    assert infos["a.weight"].shape == (8, 4) and infos["a.weight"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(_bits(r.read("a.weight", (slice(2, 6),))), _bits(ARRAYS["a.weight"][2:6]))
    assert r.read("d.scalar").item() == 2.5


def test_sharded_directory_as_transformers_writes_it(tmp_path):
    out = tmp_path / "hf"
    _write(out, max_shard_size=300)
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.endswith(".bin")]
    assert shards == [f"pytorch_model-{i:05d}-of-{len(shards):05d}.bin" for i in range(1, len(shards) + 1)]
    assert len(shards) > 1
    index = json.loads((out / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(ARRAYS)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in ARRAYS.values())
    r = TorchFileReader(out)
    for k, v in ARRAYS.items():
        assert np.array_equal(_bits(r.read(k)), _bits(v))


def test_one_shard_is_a_plain_pytorch_model_bin(tmp_path):
    assert isinstance(TorchFileWriter(tmp_path / "x"), TensorWriter)
    _write(tmp_path / "hf")
    assert sorted(os.listdir(tmp_path / "hf")) == [SINGLE_FILE]


def test_transformers_loads_the_sharded_bins(tmp_path):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
        num_hidden_layers=2, vocab_size=100, tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    out = tmp_path / "hf"
    with TorchFileWriter(out, max_shard_size=20_000) as w:
        for k, v in model.state_dict().items():
            w.write(k, v.numpy())
    cfg.save_pretrained(out)
    loaded = transformers.LlamaForCausalLM.from_pretrained(out, use_safetensors=False).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_write_pieces_assembles_a_stacked_tensor(tmp_path):
    stacked = RNG.standard_normal((3, 2, 2)).astype(np.float32)
    with TorchFileWriter(tmp_path / "m.pt") as w:
        w.write_pieces("s", stacked.shape, stacked.dtype, (((i,), stacked[i]) for i in range(3)))
    assert np.array_equal(TorchFileReader(tmp_path / "m.pt").read("s"), stacked)


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"w": torch.zeros(2), "evil": _RunsCode(str(marker))}, tmp_path / "bad.bin", pickle_module=pickle)
    with pytest.raises(CorruptCheckpointError, match="could run code"):
        TorchFileReader(tmp_path / "bad.bin").tensors()
    assert not marker.exists()


def test_truncated_file_gives_a_clear_error(tmp_path):
    _write(tmp_path / "model.pt")
    p = tmp_path / "model.pt"
    p.write_bytes(p.read_bytes()[:200])
    with pytest.raises(CorruptCheckpointError, match="model.pt: not a readable torch.save file"):
        TorchFileReader(p).tensors()


def test_failed_write_leaves_no_model_behind(tmp_path):
    with pytest.raises(RuntimeError):
        with TorchFileWriter(tmp_path / "hf", max_shard_size=100) as w:
            w.write("a", ARRAYS["b.weight"])
            raise RuntimeError("conversion failed")
    assert os.listdir(tmp_path / "hf") == []


@pytest.mark.parametrize("target", [3, "../elsewhere/pytorch_model.bin", "/etc/passwd"])
def test_index_may_only_name_files_in_its_directory(tmp_path, target):
    torch.save({"a": torch.zeros(2)}, tmp_path / "pytorch_model-00001-of-00001.bin")
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": target}}))
    with pytest.raises(CorruptCheckpointError, match="pytorch_model.bin.index.json: not a valid index"):
        TorchFileReader(tmp_path)


def test_a_dtype_numpy_cannot_hold_is_a_clear_error(tmp_path):
    torch.save({"a": torch.zeros(2, dtype=torch.uint16)}, tmp_path / "m.pt")
    with pytest.raises(UnsupportedModelError, match="m.pt: tensor 'a': torch dtype torch.uint16 has no numpy equivalent"):
        TorchFileReader(tmp_path / "m.pt").tensors()


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_reading_a_mapped_file_does_not_keep_its_pages_resident(tmp_path):
    """A conversion reads every tensor once: the mapped pages must not pile up in RSS (a whole model's worth)."""
    rng = np.random.default_rng(3)
    tensors = {f"w{i}": torch.from_numpy(rng.standard_normal((2048, 2048), dtype=np.float32)) for i in range(4)}  # 64 MB
    path = tmp_path / "model.pt"
    torch.save(tensors, path)
    with TorchFileReader(path) as reader:
        reader.tensors()
        before = _rss_file_kb()
        for name, t in tensors.items():
            np.testing.assert_array_equal(reader.read(name), t.numpy())
        grown_mb = (_rss_file_kb() - before) / 1024
        # Read again after the pages were dropped: the bytes fault back in from the file, unchanged.
        np.testing.assert_array_equal(reader.read("w0", (slice(5, 9),)), tensors["w0"].numpy()[5:9])
    assert grown_mb < 8, f"{grown_mb:.0f} MB of the 64 MB file stayed mapped after reading it"
