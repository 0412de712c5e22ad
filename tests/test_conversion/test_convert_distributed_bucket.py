"""Specification: `maxckpt convert` on several processes writes to a gs:// or s3:// DST what one process writes.

On a Cloud TPU pod the hosts share no filesystem, only the bucket: each
process writes its share into DST itself (MaxText through TensorStore, the
others through a local spool it uploads), process 0 merges what spans the
shares from the bucket and writes the `complete` marker last, once all
succeeded. A process killed mid-way leaves no committed DST (the partial
output is removed) and the survivor stops with one error. Real servers
(fake-gcs-server, moto) and real processes joined by jax.distributed.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest

from test_convert_distributed import _tensors, maxtext_run, run_processes, single  # noqa: F401 - fixtures

from maxckpt.formats import HFOptions
from maxckpt.storage import objects, outputs

ARGS = ("--model", "llama3.1", "--max-shard-size", "20KB", "--megatron-spec", "local")


def _ok(results) -> None:
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"process {rank} failed:\n{out[-3000:]}"


def _converts_again(src, dst: str, to: str, single) -> None:
    """After a failed run, one process converts into the same DST, and gets what a clean run writes."""
    from maxckpt.conversion.pipeline import convert

    convert(src, dst, to=to, model="llama3.1", options=HFOptions(max_shard_size="20KB") if to == "hf" else None)
    got, expected = _tensors(dst), _tensors(single[to])
    assert set(got) == set(expected) and all(np.array_equal(got[n], a) for n, a in expected.items())


def _names(url: str) -> list[str]:
    """Every object below `url`, relative to it."""
    return sorted(f[len(url) + 1:] for f in objects.find_files(url))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    "to,scheme,n",
    [("hf", "gs", 2), ("megatron", "s3", 2), ("torchtitan", "gs", 2), ("maxtext", "gs", 2), ("maxtext", "s3", 2), ("hf", "s3", 2),
     ("maxtext", "gs", 4), ("torchtitan", "s3", 4)],
)
def test_processes_write_to_a_bucket_the_tensors_one_process_writes(object_stores, maxtext_run, single, to, scheme, n):
    store = object_stores[scheme]
    dst = store.url(store.new_bucket(), "export", to)
    results, _ = run_processes(maxtext_run, dst, to, n, *ARGS)
    _ok(results)
    assert all(f"process {rank} of {n} wrote" in out for rank, (_, out) in enumerate(results))
    names = _names(dst)
    assert outputs.COMPLETE in names and outputs.WRITING not in names
    assert not [name for name in names if ".maxckpt-share-" in name]  # the DCP metadata parts were merged and removed
    if to == "hf":
        shards = [name for name in names if name.endswith(".safetensors")]
        assert len(shards) > 2 and all(name.endswith(f"-of-{len(shards):05d}.safetensors") for name in shards)
        assert "model.safetensors.index.json" in names and "config.json" in names
    elif to == "maxtext":
        assert {name.split("/")[2] for name in names if name.startswith("0/items/ocdbt.process_")} == {f"ocdbt.process_{k}" for k in range(n)}
        assert "0/items/manifest.ocdbt" in names and "0/_CHECKPOINT_METADATA" in names
        # Stock Orbax restores the merged databases straight from the bucket (on s3:// with maxckpt's URL mapping).
        from orbax_checks import plain_orbax_restore

        from maxckpt.compat import orbax_s3

        orbax_s3.install()
        restored = plain_orbax_restore(f"{dst}/0/items")
        for name, array in _tensors(single[to]).items():
            leaf = restored
            for key in name.split("/"):
                leaf = leaf[key]
            np.testing.assert_array_equal(np.asarray(leaf), array, err_msg=name)
    else:
        assert sorted(name.rsplit("/", 1)[1] for name in names if name.endswith(".distcp")) == [f"__{k}_0.distcp" for k in range(n)]
        local = sorted(str(p.relative_to(single[to])) for p in single[to].rglob("*") if p.is_file() and p.suffix != ".distcp")
        assert sorted(name for name in names if not name.endswith(".distcp") and not name.startswith(".maxckpt-")) == local
    # Read back from the bucket through maxckpt's readers: every tensor equals the single-process output's.
    expected, got = _tensors(single[to]), _tensors(dst)
    assert set(got) == set(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("to,scheme", [("hf", "gs"), ("maxtext", "s3")])
def test_a_process_killed_mid_way_leaves_no_committed_bucket_dst(object_stores, maxtext_run, single, to, scheme):
    """Rank 1 SIGKILLed: process 0 prints one error naming it and removes what was written; DST converts again."""
    store = object_stores[scheme]
    dst = store.url(store.new_bucket(), "export", to)
    results, seconds = run_processes(maxtext_run, dst, to, 2, *ARGS, kill={1: 2}, timeout=20, limit=150)
    assert results[1][0] == -signal.SIGKILL
    code, out = results[0]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, out[-3000:]
    assert "process 1 of 2 stopped (killed or crashed)" in errors[0]
    assert seconds < 120
    assert objects.find_files(dst) == []  # nothing committed, nothing half-written left
    _converts_again(maxtext_run, dst, to, single)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_killed_process_0_is_one_error_on_the_others_and_its_partial_output_is_removed(object_stores, maxtext_run,
                                                                                         single):
    """Process 0 (the coordinator) killed: its coordination service outlives it in a child, so the survivor sees
    its heartbeat stop, says so in one error, and removes what was written (process 0's `writing` record too)."""
    store = object_stores["gs"]
    dst = store.url(store.new_bucket(), "export", "hf")
    results, seconds = run_processes(maxtext_run, dst, "hf", 2, *ARGS, kill={0: 2}, timeout=20, limit=150)
    assert results[0][0] == -signal.SIGKILL
    code, out = results[1]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1, out[-3000:]
    assert "process 0 of 2 stopped (killed or crashed)" in errors[0]
    assert seconds < 90
    assert objects.find_files(dst) == []  # nothing committed, nothing half-written left
    _converts_again(maxtext_run, dst, "hf", single)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_an_existing_bucket_dst_is_kept_without_overwrite_and_replaced_with_it(object_stores, maxtext_run, single):
    """Only process 0 judges DST: without --overwrite every process stops with one error and DST is untouched."""
    from maxckpt.conversion.pipeline import convert

    store = object_stores["s3"]
    dst = store.url(store.new_bucket(), "export", "hf")
    convert(maxtext_run, dst, to="hf", model="llama3.1")  # one file: model.safetensors
    before = _names(dst)
    results, _ = run_processes(maxtext_run, dst, "hf", 2, *ARGS)
    for code, out in results:
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert code != 0 and len(errors) == 1 and "already exists" in errors[0], out[-3000:]
    assert _names(dst) == before
    results, _ = run_processes(maxtext_run, dst, "hf", 2, *ARGS, "--overwrite")
    _ok(results)
    names = _names(dst)
    assert "model.safetensors" not in names and "model.safetensors.index.json" in names and outputs.COMPLETE in names
    got, expected = _tensors(dst), _tensors(single["hf"])
    assert set(got) == set(expected) and all(np.array_equal(got[n], a) for n, a in expected.items())


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_failure_on_one_process_is_one_error_everywhere_and_removes_the_bucket_output(object_stores, maxtext_run):
    store = object_stores["s3"]
    dst = store.url(store.new_bucket(), "export", "megatron")
    results, _ = run_processes(maxtext_run, dst, "megatron", 2, *ARGS, fail={1: 2}, limit=150)
    lines = []
    for code, out in results:
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert code != 0 and len(errors) == 1, out[-3000:]
        lines.append(errors[0])
    assert "No space left on device" in lines[1]
    assert lines[0].startswith("error: process 1 of 2 failed:") and "No space left on device" in lines[0]
    assert objects.find_files(dst) == []


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_hung_process_leaves_the_bucket_output_partial_not_committed(object_stores, maxtext_run):
    """A hung process may still write after the others gave up: DST stays recognisable partial output."""
    from maxckpt.conversion import open_checkpoint
    from maxckpt.errors import CheckpointNotFoundError

    store = object_stores["gs"]
    dst = store.url(store.new_bucket(), "export", "maxtext")
    results, _ = run_processes(maxtext_run, dst, "maxtext", 2, *ARGS, hang={1: 2}, timeout=12, limit=90)
    code, out = results[0]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1 and "process 1 of 2 made no progress for 12 s" in errors[0], out[-3000:]
    names = _names(dst)
    assert outputs.WRITING in names and outputs.COMPLETE not in names
    with pytest.raises(CheckpointNotFoundError, match="unfinished conversion output"):
        open_checkpoint(dst)


@pytest.mark.parametrize("fmt", ["hf", "dcp"])
def test_shares_spooled_by_separate_writers_merge_from_the_bucket(bucket_url, fmt):
    """The writers' part of a bucket scale-out, in one process: each share goes up from its own spool, and
    process 0's merge (HF index, DCP `.metadata`) reads only the bucket, never another spool."""
    from maxckpt.containers.dcp import DcpReader, DcpWriter
    from maxckpt.containers.safetensors import SafetensorsReader, SafetensorsWriter
    from maxckpt.conversion.distributed import Share, plan_shares
    from maxckpt.tensors import TensorInfo

    rng = np.random.default_rng(0)
    arrays = {f"t{i}": rng.standard_normal((8, 4 + i)).astype(np.float32) for i in range(6)}
    infos = tuple(TensorInfo(n, a.shape, a.dtype) for n, a in arrays.items())
    owner = dict(zip(arrays, plan_shares([i.nbytes for i in infos], 2)))
    dst = f"{bucket_url}/out"
    outputs.begin(dst)

    def open_writer(path, rank):
        share = Share(rank, 2, infos, owner)
        return (SafetensorsWriter(path, max_shard_size=200, share=share) if fmt == "hf" else DcpWriter(path, share=share)), share

    with outputs.spooled(dst) as spool1:  # process 1: writes, closes, uploads, and its spool is gone
        writer, share = open_writer(spool1, 1)
        for name in share.mine:
            writer.write(name.name, arrays[name.name])
        writer.close()
    with outputs.spooled(dst) as spool0:  # process 0
        writer, share = open_writer(spool0, 0)
        for name in share.mine:
            writer.write(name.name, arrays[name.name])
        writer.close()
        writer.finish_shares(share)
    outputs.commit(dst)
    names = objects.list_names(dst)
    assert outputs.COMPLETE in names and outputs.WRITING not in names and not [n for n in names if "share" in n]
    reader = SafetensorsReader(dst) if fmt == "hf" else DcpReader(dst)
    assert set(reader.tensors()) == set(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(reader.read(name), array, err_msg=name)
