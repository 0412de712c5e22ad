"""Specification: `--to torch` on several processes writes the tensors one process writes, into a folder or a bucket.

Each process writes the `pytorch_model-*.bin` shards of its share, numbered among every process's shards;
process 0 writes the index and the HF config files once all are in, and merges the manifest. One torch.save
file cannot be split between processes: asking for one is refused before anything starts.
"""

from __future__ import annotations

import json

import pytest

from test_convert_distributed import _tensors, maxtext_run, run_processes  # noqa: F401 - fixtures

from maxckpt.conversion.options import Distributed
from maxckpt.errors import ConversionError

ARGS = ("--model", "llama3.1", "--max-shard-size", "20KB")


@pytest.fixture(scope="module")
def single_torch(maxtext_run, tmp_path_factory):  # noqa: F811 - the fixture imported above
    from maxckpt.conversion.pipeline import convert
    from maxckpt.formats import TorchOptions

    dst = tmp_path_factory.mktemp("single") / "torch"
    convert(maxtext_run, dst, to="torch", model="llama3.1", options=TorchOptions(max_shard_size="20KB"))
    return dst


def _same_tensors(got_at, expected_at) -> None:
    expected, got = _tensors(expected_at), _tensors(got_at)
    assert set(got) == set(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].tobytes() == array.tobytes(), name


def _ok(results, n: int) -> None:
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"process {rank} failed:\n{out[-3000:]}"
        assert f"process {rank} of {n} wrote" in out


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_write_a_torch_folder_torch_loads(maxtext_run, single_torch, tmp_path):  # noqa: F811
    import torch

    from maxckpt.conversion.integrity_check import check_integrity

    dst = tmp_path / "out"
    results, _ = run_processes(maxtext_run, dst, "torch", 2, *ARGS)
    _ok(results, 2)
    index = json.loads((dst / "pytorch_model.bin.index.json").read_text())
    shards = sorted(p.name for p in dst.glob("pytorch_model-*.bin"))
    assert sorted(set(index["weight_map"].values())) == shards and len(shards) > 2
    assert all(name.endswith(f"-of-{len(shards):05d}.bin") for name in shards)
    assert not list(dst.glob(".*")) and sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporaries
    loaded = {}
    for shard in shards:  # torch itself loads every process's files
        loaded.update(torch.load(dst / shard, weights_only=True))
    assert set(loaded) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in loaded.values())
    _same_tensors(dst, single_torch)
    for name in ("config.json", "generation_config.json"):
        assert (dst / name).read_text() == (single_torch / name).read_text()
    report = check_integrity(dst)
    assert report.manifest is not None and report.ok


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_write_a_torch_folder_to_a_bucket(object_stores, maxtext_run, single_torch):  # noqa: F811
    from maxckpt.storage import objects, outputs

    store = object_stores["s3"]
    dst = store.url(store.new_bucket(), "export", "torch")
    results, _ = run_processes(maxtext_run, dst, "torch", 2, *ARGS)
    _ok(results, 2)
    names = sorted(f[len(dst) + 1:] for f in objects.find_files(dst))
    assert outputs.COMPLETE in names and outputs.WRITING not in names
    shards = [n for n in names if n.startswith("pytorch_model-")]
    assert len(shards) > 2 and "pytorch_model.bin.index.json" in names and "config.json" in names
    _same_tensors(dst, single_torch)


def test_one_torch_file_is_refused_for_several_processes_before_anything_starts(tmp_path):
    from maxckpt.conversion.pipeline import convert

    with pytest.raises(ConversionError, match=r"--to torch into one file \(x.pt\) is written by one process"):
        convert(tmp_path, tmp_path / "x.pt", to="torch",
                distributed=Distributed(coordinator="127.0.0.1:1234", num_processes=2, process_id=0))
    assert list(tmp_path.iterdir()) == []
