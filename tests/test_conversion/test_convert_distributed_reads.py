"""Specification: N conversion processes split the reads, not only the writes: each asks its source for ~1/N of the bytes.

What is counted is what each process's readers return (maxckpt.containers.read_count), since `/proc/self/io`
misses TensorStore's and safetensors' mapped reads. A scanned MaxText source converted to per-layer outputs is
the hard case: its tensors stack every layer, so each process must read only its own run of layers of them.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from test_convert_distributed import _tensors, run_processes

from maxckpt.conversion.distributed import layer_of, layer_window, plan_shares

NOTE = re.compile(r"process (\d+) of (\d+) wrote \d+ of \d+ tensors \(.*?\) and read ([\d,]+) bytes of the source "
                  r"\(peak RSS ([\d.]+) (KiB|MiB|GiB)\)")
ARGS = ("--model", "llama3.1", "--max-shard-size", "20KB")


@pytest.fixture(scope="module")
def deep_run(tmp_path_factory):
    """A scanned MaxText run of 8 layers: enough for 4 processes to take 2 whole layers each."""
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    spec = tiny_spec("llama3.1", layers=8, vocab=96)
    return save_maxtext_run(tmp_path_factory.mktemp("src") / "run", random_maxtext_params(spec), step=4).parent


@pytest.fixture(scope="module")
def one_process(deep_run, tmp_path_factory):
    from maxckpt.conversion.pipeline import convert
    from maxckpt.formats import HFOptions

    dst = tmp_path_factory.mktemp("one") / "hf"
    report = convert(deep_run, dst, to="hf", model="llama3.1", options=HFOptions(max_shard_size="20KB"))
    return dst, report


def _reads(results, n: int) -> tuple[list[int], list[float]]:
    """Bytes each process read of the source, and its peak RSS in MiB, from its note."""
    read, rss = [0] * n, [0.0] * n
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"process {rank} failed:\n{out[-3000:]}"
        (m,) = [m for m in NOTE.finditer(out)]
        assert (int(m.group(1)), int(m.group(2))) == (rank, n)
        read[rank] = int(m.group(3).replace(",", ""))
        rss[rank] = float(m.group(4)) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[m.group(5)]
    return read, rss


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_each_of_n_processes_reads_about_one_nth_of_the_source(deep_run, one_process, tmp_path, n):
    single, report = one_process
    results, _ = run_processes(deep_run, tmp_path / "out", "hf", n, *ARGS)
    read, rss = _reads(results, n)
    total = report.bytes_read
    assert total == sum(a.nbytes for a in _tensors(single).values())  # one process reads each source byte once
    assert sum(read) == total  # together they read it once: no process reads another's layers
    for rank, nbytes in enumerate(read):
        assert abs(nbytes - total / n) <= 0.2 * total / n, (rank, read, total)
        assert rss[rank] < 1500, rss  # bounded: the JAX import and a few tensors, nothing the size of the model
    expected, got = _tensors(single), _tensors(tmp_path / "out")
    assert set(got) == set(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].tobytes() == array.tobytes(), name


def test_layers_go_to_processes_as_contiguous_runs_balanced_by_bytes():
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(8)] + ["model.embed_tokens.weight", "lm_head.weight"]
    sizes = [10] * 8 + [10, 10]
    owner = plan_shares(sizes, 4, [layer_of(n) for n in names])
    assert owner[8:] == [0, 1]  # the global tensors first, each to the lightest process
    assert owner[:8] == [0, 1, 1, 2, 2, 3, 3, 3]  # then runs of layers, in order, filling each to a quarter
    loads = [sum(s for s, o in zip(sizes, owner) if o == r) for r in range(4)]
    assert max(loads) <= sum(sizes) / 4 + 10  # within one layer of an equal share
    assert [layer_window(names, owner, r) for r in range(4)] == [(0, 1), (1, 3), (3, 5), (5, 8)]
    # Fewer layers than processes: tensor by tensor, as without layers; no window.
    few = plan_shares([5, 5, 1], 4, [0, 1, None])
    assert few == plan_shares([5, 5, 1], 4) == [0, 1, 2]
    assert layer_window(["layers.0.w", "layers.1.w", "x"], [0, 0, 1], 0) == (0, 2)
    assert layer_window(["layers.0.w", "layers.1.w", "layers.2.w"], [0, 1, 0], 0) is None  # not one run


def test_a_windowed_layer_group_reads_only_its_layers():
    from maxckpt.containers.read_count import CountingReader
    from maxckpt.layouts.transforms import LayerGroups
    from maxckpt.tensors import LazyTensor

    class Reader:
        def tensors(self):
            return {}

        def read(self, name, index=None):
            return stored[index] if index is not None else stored

    stored = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)  # 6 layers on axis 1
    counted = CountingReader(Reader())
    t = LazyTensor("w", stored.shape, stored.dtype, lambda index: counted.read("w", index))
    groups = LayerGroups(budget=1 << 20)  # every layer fits one group
    groups.positions["w"], groups.window = (0, 1, 2, 3, 4, 5), (2, 4)
    for layer in (2, 3):
        np.testing.assert_array_equal(groups.layer(t, 1, layer), stored[:, layer])
    assert counted.bytes_read == stored[:, 2:4].nbytes and counted.reads == 1
