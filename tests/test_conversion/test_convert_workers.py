"""`maxckpt convert --workers N`: parallel read-ahead gives the same output for any N, and fails as cleanly as one thread.

Several reader threads compute tensors (and layer pieces) ahead of the
writer; these tests pin what users rely on: byte-identical files whatever N,
an error in a reader thread (damaged data) or in the writer (a full disk)
surfacing as the one `error:` line a serial run prints with nothing left at
DST, and a bad N refused before anything is read.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from cli_runner import run_cli
from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
from hostile_tools import assert_unchanged, one_error_line, small_tmpfs, snapshot
from maxckpt.formats import HFOptions, TorchOptions
from maxckpt.conversion.options import SourceOptions
from maxckpt.conversion import convert
from maxckpt.conversion.scheduling import run_ordered, validate_workers
from maxckpt.errors import ConversionError
from maxckpt.layouts.transforms import LayerGroups, shared_result
from maxckpt.tensors import LazyTensor

TARGETS = ["hf", "maxtext", "megatron", "torchtitan", "torch"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    spec = tiny_spec("llama2", layers=4)
    return save_maxtext_run(tmp_path_factory.mktemp("src") / "run", random_maxtext_params(spec), step=1).parent


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under `root` (or of `root` itself when it is a file)."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root) if p != root else p.name): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def output_of(dst: Path) -> dict:
    """What must not depend on the worker count: every file's bytes, except OCDBT's and DCP's plan.

    An OCDBT database (MaxText output) names its data files at random and
    records write times, so two runs never match byte for byte whatever the
    threads; there, every array (read back exactly) and the tree metadata count.
    """
    items = next(dst.glob("*/items"), None)
    if items is None:
        digests = tree_digest(dst)
        for meta in dst.rglob(".metadata"):  # DCP: a fresh save id and the folder's path, then the plan
            from maxckpt.containers.dcp import load_metadata

            md = load_metadata(meta.parent)
            digests[str(meta.relative_to(dst))] = repr((md.state_dict_metadata, md.storage_data, md.planner_data))
        return digests
    from maxckpt.containers.orbax import OrbaxReader

    with OrbaxReader(items) as reader:
        arrays = {name: (str(a.dtype), a.shape, a.tobytes()) for name in reader.tensors() for a in [reader.read(name)]}
    return {"arrays": arrays, "_METADATA": (items / "_METADATA").read_text()}


def shards_of(target: str, size: str) -> HFOptions | TorchOptions | None:
    """The options of `target` that set its shard size (hf and torch outputs have shards), else None."""
    return {"hf": HFOptions, "torch": TorchOptions}[target](max_shard_size=size) if target in ("hf", "torch") else None


@pytest.mark.parametrize("target", TARGETS)
def test_one_and_four_workers_write_identical_files(run_dir, tmp_path, target):
    outs = {}
    for workers in (1, 4):
        dst = tmp_path / f"out-{workers}"
        convert(run_dir, dst, to=target, model="llama2", workers=workers, options=shards_of(target, "40KB"))
        outs[workers] = output_of(dst)
    assert outs[1] == outs[4]
    assert len(outs[1]) >= 2


@pytest.mark.parametrize("source", ["hf", "megatron", "torchtitan", "torch"])
def test_back_to_maxtext_is_the_same_for_any_worker_count(run_dir, tmp_path, source):
    src = tmp_path / "src"
    convert(run_dir, src, to=source, model="llama2", options=shards_of(source, "40KB"))
    outs = {}
    for workers in (1, 4):
        dst = tmp_path / f"back-{workers}"
        convert(src, dst, to="maxtext", model="llama2", workers=workers)
        outs[workers] = output_of(dst)
    assert outs[1] == outs[4]


def test_small_read_budget_with_many_workers_matches(run_dir, tmp_path):
    # A tiny budget splits the stacked layers into several groups read by different threads.
    a, b = tmp_path / "a", tmp_path / "b"
    convert(run_dir, a, to="hf", model="llama2", workers=1)
    convert(run_dir, b, to="hf", model="llama2", workers=4, source=SourceOptions(read_budget="20KB"))
    assert tree_digest(a) == tree_digest(b)


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_bad_worker_count_is_one_error_line(run_dir, tmp_path, capsys, value):
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", run_dir, dst, "--to", "hf", "--model", "llama2", "-q", "--workers", value], capsys)
    one_error_line(code, err, "workers must be a whole number >= 1", repr(value) if value == "many" else value)
    assert not dst.exists() and not list(tmp_path.glob("out.tmp-*"))


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_bad_worker_count_in_the_api(run_dir, tmp_path, value):
    with pytest.raises(ConversionError, match="workers must be a whole number >= 1"):
        convert(run_dir, tmp_path / "out", to="hf", model="llama2", workers=value)
    assert not (tmp_path / "out").exists()


def test_worker_count_default_and_text():
    assert validate_workers(None) >= 1
    assert validate_workers("3") == 3


def test_damaged_chunk_read_on_a_worker_thread_is_one_error(run_dir, tmp_path, capsys):
    run = Path(shutil.copytree(run_dir, tmp_path / "run"))
    items = next(run.glob("checkpoints/*/items"))
    for f in (items / "ocdbt.process_0" / "d").iterdir():
        if f.stat().st_size > 20_000:
            f.write_bytes(f.read_bytes()[:1000])
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", run, dst, "--to", "hf", "--model", "llama2", "-q", "--workers", "4"], capsys)
    one_error_line(code, err, "reading array")
    assert not dst.exists() and not list(tmp_path.glob("out.tmp-*"))


@pytest.mark.parametrize("target", ["hf", "maxtext"])
def test_full_disk_with_four_workers_is_one_error_and_leaves_nothing(tmp_path, capsys, target):
    spec = tiny_spec("llama2", vocab=65536)  # two 8 MB embedding tables: more than the 2 MB disk holds
    run = save_maxtext_run(tmp_path / "src" / "run", random_maxtext_params(spec), step=1).parent
    with small_tmpfs(tmp_path / "disk") as disk:
        (disk / "keep.txt").write_text("already here\n")
        dst = disk / "out"
        before = snapshot(disk)
        code, _, err = run_cli(["convert", run, dst, "--to", target, "--model", "llama2", "-q", "--workers", "4"], capsys)
        one_error_line(code, err, f"cannot write {dst}", "No space left on device", "the partial output was removed")
        assert_unchanged(before, disk)


# ----------------------------------------------------------------- the scheduler itself


def _tracked_units(count: int, pause: Callable[[int], float]) -> tuple[list, dict]:
    """`count` units of 10 bytes that record how many bytes of units were being computed at once ("most")."""
    lock = threading.Lock()
    state = {"live": 0, "most": 0}

    def unit(k: int):
        def fn():
            with lock:
                state["live"] += 10
                state["most"] = max(state["most"], state["live"])
            time.sleep(pause(k))
            with lock:
                state["live"] -= 10
            return k

        return fn

    return [(10, unit(k)) for k in range(count)], state


def test_run_ordered_keeps_order_and_bounds_bytes_in_flight():
    units, state = _tracked_units(40, lambda k: 0.002 * (5 - k % 5))  # later units often finish first
    got = list(run_ordered(units, workers=4, budget=30))
    assert got == list(range(40))
    assert state["most"] <= 30  # never more than the budget being computed at once


def test_run_ordered_counts_what_the_consumer_still_holds_in_the_budget():
    """Writes a writer has queued share the budget: while they fill it, one read runs at a time."""

    def run(queued: int) -> int:
        units, state = _tracked_units(20, lambda k: 0.003)
        got = list(run_ordered(units, workers=4, budget=40, outstanding=lambda: queued))
        assert got == list(range(20))
        return state["most"]

    assert run(queued=40) == 10  # the budget is full of queued writes: units run one by one, none is skipped
    assert run(queued=20) <= 20
    assert run(queued=0) > 10  # nothing queued: reads overlap


def test_run_ordered_runs_a_unit_larger_than_the_budget():
    assert list(run_ordered([(100, lambda: "big"), (1, lambda: "small")], workers=2, budget=10)) == ["big", "small"]


def test_run_ordered_raises_a_failed_unit_in_turn_and_waits_for_the_others():
    finished = []

    def slow():
        time.sleep(0.05)
        finished.append("slow")
        return "slow"

    def boom():
        raise OSError("disk on fire")

    stream = run_ordered([(1, lambda: "first"), (1, boom), (1, slow)], workers=3, budget=10)
    assert next(stream) == "first"
    with pytest.raises(OSError, match="disk on fire"):
        next(stream)
    stream.close()
    assert finished in ([], ["slow"])  # started units are over once closed, never still running


def test_layer_groups_from_many_threads_read_each_group_once():
    reads = []
    base = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4, 8, 3)  # layers on axis 1

    def fn(index):
        reads.append(index)
        time.sleep(0.01)
        return base if index is None else base[index]

    t = LazyTensor("w", base.shape, base.dtype, fn)
    groups = LayerGroups(budget=1 << 20)
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, groups.layer(t, 1, i))) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(reads) == 1
    for i in range(8):
        np.testing.assert_array_equal(out[i], base[:, i])


def test_shared_result_computes_once_for_concurrent_callers():
    calls = []

    @shared_result(keep=2)
    def fused(i: int):
        calls.append(i)
        time.sleep(0.02)
        return i * 10

    results = []
    threads = [threading.Thread(target=lambda: results.append(fused(3))) for _ in range(5)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == [30] * 5 and calls == [3]


@pytest.mark.parametrize("workers", [1, 4])
def test_megatron_to_maxtext_reads_each_fused_tensor_once_and_is_exact(run_dir, tmp_path, monkeypatch, workers):
    """Layer-major writing: q/k/v (and gate/up) of a layer come from one read of Megatron's fused tensor.

    Written tensor by tensor, the fused `linear_qkv` was read three times
    (for MaxText's query, key and value arrays) and `linear_fc1` twice.
    """
    from maxckpt.containers.dcp import DcpReader
    from maxckpt.containers.orbax import OrbaxReader

    mcore = tmp_path / "mcore"
    convert(run_dir, mcore, to="megatron", model="llama2")
    reads: dict[tuple[str, int], int] = {}
    lock = threading.Lock()
    original = DcpReader.read_chunk

    def counting(self, name, i):
        with lock:
            reads[(name, i)] = reads.get((name, i), 0) + 1
        return original(self, name, i)

    monkeypatch.setattr(DcpReader, "read_chunk", counting)
    back = tmp_path / "back"
    convert(mcore, back, to="maxtext", model="llama2", workers=workers)
    monkeypatch.undo()

    fused = {k: n for k, n in reads.items() if k[0].endswith(("linear_qkv.weight", "linear_fc1.weight"))}
    assert len(fused) == 2 * 4  # 4 layers, one qkv and one fc1 chunk each (Megatron stores one chunk per layer)
    assert set(reads.values()) == {1}, {k: n for k, n in reads.items() if n != 1}

    with OrbaxReader(next(run_dir.glob("checkpoints/*/items"))) as a, OrbaxReader(back / "0" / "items") as b:
        params = [n for n in a.tensors() if n.startswith("params/")]
        assert params and set(params) <= set(b.tensors())
        for name in params:
            np.testing.assert_array_equal(a.read(name), b.read(name))


def test_layer_major_order_interleaves_pieces_and_keeps_every_one():
    from maxckpt.conversion.pipeline import write_order

    arr = np.zeros((3, 2), np.float32)
    tensors = {
        "embed": LazyTensor.from_array("embed", arr),
        "q": LazyTensor.stacked("q", [LazyTensor.from_array(f"q{i}", arr) for i in range(3)], axis=1),
        "k": LazyTensor.stacked("k", [LazyTensor.from_array(f"k{i}", arr) for i in range(3)], axis=1),
        "norm": LazyTensor.from_array("norm", arr[0]),
    }
    tensors["empty"] = LazyTensor("empty", (0, 2), np.dtype(np.float32), lambda index: np.zeros((0, 2), np.float32), pieces=())
    steps = [(t.name, k) for t, k in write_order(tensors, layer_major=True)]
    assert steps == [("embed", None), ("norm", None), ("q", 0), ("k", 0), ("q", 1), ("k", 1), ("q", 2), ("k", 2)]
    assert sorted(steps, key=str) == sorted(((t.name, k) for t, k in write_order(tensors)), key=str)
