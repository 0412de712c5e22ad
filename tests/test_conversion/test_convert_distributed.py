"""Specification: `maxckpt convert` on N local processes (jax.distributed on 127.0.0.1) writes what one process writes.

Each process converts a size-balanced share and writes its own shards; process
0 commits DST once every process succeeded. A process killed mid-way leaves no
DST and the others stop with one clear error.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from maxckpt.conversion.options import SourceOptions
from maxckpt.formats import HFOptions, MegatronOptions
from maxckpt.conversion.distributed import distributed_request, plan_shares
from maxckpt.errors import ConversionError

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parents[1] / "procs" / "convert_worker.py"
TIMEOUT = 30  # --distributed-timeout in these tests: heartbeats every 7 s, so a dead process is seen within ~15 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **extra}
    env.pop("XLA_FLAGS", None)
    return env


def slurm_port() -> int:
    """A free port in the range JAX's SLURM detection derives from the job id (61440 + id % 4096)."""
    import random

    for port in random.sample(range(61440, 65536), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip("no free port in 61440-65535")


def run_processes(src: Path, dst: Path, to: str, n: int, *args: str, kill: dict[int, int] | None = None,
                  fail: dict[int, int] | None = None, hang: dict[int, int] | None = None, timeout: int = TIMEOUT,
                  limit: float = 240, slurm: bool = False):
    """Start `n` conversion processes; returns [(returncode, output)] and the seconds they took.

    `slurm`: no --coordinator flags but `--distributed`, with the environment a SLURM job step gives
    each task (JAX detects the cluster from it).
    """
    port = slurm_port() if slurm else free_port()
    procs = []
    for rank in range(n):
        extra = {"MAXCKPT_TEST_KILL_AFTER": str(kill[rank])} if kill and rank in kill else {}
        if slurm:
            extra.update(SLURM_JOB_ID=str(port - 61440), SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS=str(n),
                         SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_STEP_NUM_NODES="1")
        if fail and rank in fail:
            extra["MAXCKPT_TEST_FAIL_AFTER"] = str(fail[rank])
        if hang and rank in hang:
            extra["MAXCKPT_TEST_HANG_AFTER"] = str(hang[rank])
        joining = ["--distributed"] if slurm else ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n),
                                                   "--process-id", str(rank)]
        cmd = [sys.executable, str(WORKER), str(src), str(dst), "--to", to, "-q", *joining,
               "--distributed-timeout", str(timeout), *args]
        procs.append(subprocess.Popen(cmd, env=_env(**extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    started = time.monotonic()
    results = []
    try:
        for rank, proc in enumerate(procs):
            if hang and rank in hang:
                continue  # it never ends by itself: stopped below, once the others are done
            out, _ = proc.communicate(timeout=max(1.0, limit - (time.monotonic() - started)))
            results.append((proc.returncode, out))
        for rank in sorted(hang or ()):
            procs[rank].kill()
            results.insert(rank, (None, procs[rank].communicate()[0]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results, time.monotonic() - started


@pytest.fixture(scope="module")
def maxtext_run(tmp_path_factory):
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    spec = tiny_spec("llama3.1", layers=3, vocab=96)
    run = save_maxtext_run(tmp_path_factory.mktemp("src") / "run", random_maxtext_params(spec), step=4).parent
    return run


def local_with_shards(to: str, size: str) -> HFOptions | MegatronOptions | None:
    """What `--max-shard-size SIZE --megatron-spec local` ask of target `to`."""
    return {"hf": HFOptions(max_shard_size=size), "megatron": MegatronOptions(spec="local")}.get(to)


@pytest.fixture(scope="module")
def single(maxtext_run, tmp_path_factory):
    """The single-process outputs, one per target, to compare with."""
    from maxckpt.conversion.pipeline import convert

    out = {}
    for to in ("hf", "megatron", "torchtitan", "maxtext"):
        dst = tmp_path_factory.mktemp("single") / to
        convert(maxtext_run, dst, to=to, model="llama3.1", options=local_with_shards(to, "20KB"))
        out[to] = dst
    return out


def _tensors(path: Path) -> dict[str, np.ndarray]:
    from maxckpt.conversion.checkpoint import open_checkpoint

    with open_checkpoint(path) as ckpt:
        reader = ckpt.reader
        return {name: np.asarray(reader.read(name)) for name in reader.tensors()}


def _dcp_dir(root: Path) -> Path:
    return next(p.parent for p in root.rglob(".metadata"))


def _check_hf(multi: Path, single: Path, n: int) -> None:
    from safetensors.numpy import load_file

    index = json.loads((multi / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in multi.glob("*.safetensors"))
    assert sorted(set(index["weight_map"].values())) == shards
    assert all(name.endswith(f"-of-{len(shards):05d}.safetensors") for name in shards)
    loaded = {}
    for shard in shards:
        loaded.update(load_file(multi / shard))  # the safetensors library reads each process's files
    expected = {**load_file(single / "model.safetensors")} if (single / "model.safetensors").exists() else {}
    if not expected:
        for shard in single.glob("*.safetensors"):
            expected.update(load_file(shard))
    assert set(index["weight_map"]) == set(loaded) == set(expected)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in expected.values())
    for name, array in expected.items():
        np.testing.assert_array_equal(loaded[name], array, err_msg=name)
    assert (multi / "config.json").read_text() == (single / "config.json").read_text()


def _check_dcp(multi: Path, single: Path, n: int) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from maxckpt.containers.dcp import DcpReader

    mdir, sdir = _dcp_dir(multi), _dcp_dir(single)
    ranks = sorted(p.name for p in mdir.glob("*.distcp"))
    assert ranks == sorted(f"__{r}_0.distcp" for r in range(n))
    assert not list(mdir.glob(".maxckpt-share-*"))
    m, s = DcpReader(mdir), DcpReader(sdir)
    assert list(m.tensors()) == list(s.tensors()) and m.objects() == s.objects()
    for name in s.objects():
        assert m.read_bytes(name) == s.read_bytes(name), name
    # torch.distributed.checkpoint itself loads every tensor (no process group: one reader of all ranks' files).
    state = {name: torch.zeros(info.shape, dtype=torch.float32) for name, info in s.tensors().items()}
    dcp.load(state, checkpoint_id=str(mdir), no_dist=True)
    for name in s.tensors():
        np.testing.assert_array_equal(state[name].numpy(), s.read(name), err_msg=name)
    # Sidecars: everything but the data and metadata files is the same file.
    for f in single.rglob("*"):
        if f.is_file() and not f.name.endswith(".distcp") and f.name != ".metadata":
            assert (multi / f.relative_to(single)).read_bytes() == f.read_bytes(), f


def _check_maxtext(multi: Path, single: Path, n: int) -> None:
    import orbax.checkpoint as ocp

    items = multi / "0" / "items"
    assert sorted(p.name for p in items.glob("ocdbt.process_*")) == [f"ocdbt.process_{r}" for r in range(n)]
    restored = ocp.PyTreeCheckpointer().restore(items)  # Orbax reads the merged per-process databases
    expected = _tensors(single)

    def leaf(tree, name):
        for key in name.split("/"):
            tree = tree[key]
        return np.asarray(tree)

    for name, array in expected.items():
        np.testing.assert_array_equal(leaf(restored, name), array, err_msg=name)
    meta = json.loads((multi / "0" / "_CHECKPOINT_METADATA").read_text())
    assert meta["custom_metadata"] == {"scan_layers": True}


CHECKS = {"hf": _check_hf, "megatron": _check_dcp, "torchtitan": _check_dcp, "maxtext": _check_maxtext}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("to", ["hf", "megatron", "torchtitan", "maxtext"])
def test_n_processes_write_the_tensors_one_process_writes(maxtext_run, single, tmp_path, to, n):
    dst = tmp_path / "out"
    results, _ = run_processes(maxtext_run, dst, to, n, "--model", "llama3.1", "--max-shard-size", "20KB", "--megatron-spec", "local")
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"process {rank} failed:\n{out[-3000:]}"
    assert f"process 1 of {n} wrote" in results[1][1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left
    assert not list(dst.rglob("maxckpt-owner.json"))
    CHECKS[to](dst, single[to], n)
    # Every tensor equals the single-process output's, read back through maxckpt too.
    expected, got = _tensors(single[to]), _tensors(dst)
    assert list(got) == list(expected) if to != "hf" else set(got) == set(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)
    # Each process hashed its share; process 0 merged them into one manifest, and no part file is left.
    from maxckpt.conversion.integrity_check import check_integrity
    from maxckpt.integrity import PART_PREFIX

    report = check_integrity(dst)
    assert report.manifest is not None and report.ok and not list(dst.rglob(f"{PART_PREFIX}*"))


FAMILIES = {  # MaxText-written runs (tests/fixtures/maxtext): MoE experts stored [X, L, ...], MLA, routing biases
    "deepseek3_scan": ("deepseek3-671b", ("--set", "num_experts_per_tok=2")),
    "gpt_oss_scan": ("gpt-oss-20b", ()),
    "mixtral_moe_scan": ("mixtral-8x7b", ()),
}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("run,to", [("deepseek3_scan", "megatron"), ("deepseek3_scan", "torchtitan"), ("gpt_oss_scan", "hf"),
                                    ("mixtral_moe_scan", "maxtext")])
def test_two_processes_convert_maxtext_moe_and_mla_runs_as_one_does(maxtext_fixtures, tmp_path, run, to):
    from maxckpt.conversion.pipeline import convert

    model, extra = FAMILIES[run]
    src = maxtext_fixtures / run / "checkpoints" / "5" / "items"
    args = ("--model", model, "--max-shard-size", "20KB", "--megatron-spec", "local", *extra)
    one = tmp_path / "one"
    convert(src, one, to=to, model=model, options=local_with_shards(to, "20KB"),
            source=SourceOptions(overrides={"num_experts_per_tok": 2} if extra else None))
    results, _ = run_processes(src, tmp_path / "two", to, 2, *args)
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"process {rank} failed:\n{out[-3000:]}"
    assert "process 1 of 2 wrote" in results[1][1]
    expected, got = _tensors(one), _tensors(tmp_path / "two")
    assert set(got) == set(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_distributed_alone_joins_the_cluster_jax_detects(maxtext_run, single, tmp_path):
    """`--distributed` in a (simulated) SLURM job step: JAX's auto-detection finds the coordinator and ranks."""
    dst = tmp_path / "out"
    results, _ = run_processes(maxtext_run, dst, "hf", 2, "--model", "llama3.1", "--max-shard-size", "20KB", slurm=True)
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"process {rank} failed:\n{out[-3000:]}"
        assert f"process {rank} of 2 wrote" in out
    _check_hf(dst, single["hf"], 2)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0])
def test_a_process_killed_mid_way_leaves_no_dst_and_the_others_stop(maxtext_run, tmp_path, killed):
    """Any process killed (SIGKILL, after it wrote something): the others print one error naming it, and no DST
    nor staging folder is left.

    Process 1: process 0 sees its heartbeat stop and removes its staging folder. Process 0: the coordination
    service runs in a child of it that outlives it (maxckpt.compat.jax_service), so the others see its heartbeat
    stop too, instead of JAX aborting them, and the lowest of them removes the staging folder process 0 owned.
    """
    from maxckpt.conversion.pipeline import convert

    dst = tmp_path / "out"
    results, seconds = run_processes(maxtext_run, dst, "hf", 3, "--model", "llama3.1", "--max-shard-size", "20KB",
                                     kill={killed: 2}, timeout=20, limit=150)
    assert results[killed][0] == -signal.SIGKILL
    assert seconds < 90  # a 5 s heartbeat timeout (a quarter of --distributed-timeout 20, at least 5)
    assert not dst.exists()
    for rank, (code, out) in enumerate(results):
        if rank == killed:
            continue
        assert code == 1, out[-3000:]  # a maxckpt error, never JAX's abort
        assert "Traceback" not in out and "Check failure" not in out and "bad_cast" not in out, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, out[-3000:]
        assert f"process {killed} of 3 stopped (killed or crashed)" in errors[0], out[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == []  # the staging folder was removed too
    report = convert(maxtext_run, dst, to="hf", model="llama3.1")  # and DST converts again at once
    assert not any("temporary folder" in note for note in report.notes)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_failure_on_one_process_is_the_same_error_on_every_process(maxtext_run, tmp_path):
    dst = tmp_path / "out"
    results, _ = run_processes(maxtext_run, dst, "megatron", 2, "--model", "llama3.1", "--megatron-spec", "local",
                               kill=None, fail={1: 2}, limit=150)
    lines = []
    for rank, (code, out) in enumerate(results):
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert code != 0 and len(errors) == 1, out[-3000:]
        lines.append(errors[0])
    assert "No space left on device" in lines[1]
    assert lines[0].startswith("error: process 1 of 2 failed:") and "No space left on device" in lines[0]
    assert not dst.exists() and [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_hung_process_makes_the_others_give_up_after_the_timeout(maxtext_run, tmp_path):
    dst = tmp_path / "out"
    results, seconds = run_processes(maxtext_run, dst, "hf", 2, "--model", "llama3.1", "--max-shard-size", "20KB",
                                     hang={1: 2}, timeout=12, limit=90)
    code, out = results[0]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, out[-3000:]
    assert "process 1 of 2 made no progress for 12 s" in errors[0]
    assert not dst.exists() and [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize(
    "args,message",
    [
        (dict(coordinator="127.0.0.1:1234", num_processes=2, process_id=2), "--process-id 2 is out of range for --num-processes 2"),
        (dict(coordinator="127.0.0.1:1234", num_processes=2, process_id=-1), "--process-id -1 is out of range"),
        (dict(coordinator="127.0.0.1:1234", num_processes=0, process_id=0), "--num-processes must be >= 1"),
        (dict(coordinator="127.0.0.1:1234", num_processes=2), "--process-id missing"),
        (dict(num_processes=2, process_id=0), "--coordinator missing"),
        (dict(coordinator="localhost", num_processes=2, process_id=0), "write it as HOST:PORT"),
    ],
)
def test_a_bad_process_combination_is_one_clear_error(args, message):
    with pytest.raises(ConversionError, match=message.replace("-", r"\-")):
        distributed_request(**args)


def test_a_bad_process_id_is_one_cli_error_before_anything_starts(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "maxckpt", "convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--to", "hf",
         "--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "5"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --process-id 5 is out of range for --num-processes 2")
    assert not (tmp_path / "dst").exists()


def test_shares_are_balanced_by_bytes_and_the_same_on_every_process():
    sizes = [100, 5, 60, 40, 30, 30, 1, 1]
    owner = plan_shares(sizes, 2)
    assert owner == plan_shares(list(sizes), 2)  # deterministic
    loads = [sum(s for s, o in zip(sizes, owner) if o == r) for r in range(2)]
    assert owner == [0, 0, 1, 1, 0, 1, 1, 1] and loads == [135, 132]  # largest first, each to the lighter process
    assert plan_shares([1, 1], 4) == [0, 1]
    assert plan_shares([], 3) == []


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.frameworks
@pytest.mark.filterwarnings("ignore")
def test_megatron_core_loads_what_two_processes_write(tmp_path):
    """Megatron-LM's load path on CPU takes the two ranks' files and one merged `.metadata`: same logits as MaxText."""
    import psutil  # noqa: F401 - a real dependency: fail, never skip
    import megatron.core  # noqa: F401 - a real dependency: fail, never skip
    import torch
    from conversion_models import TOKENS, random_maxtext_params, save_maxtext_run, tiny_spec
    from frameworks.megatron import gpt_model
    from frameworks.megatron import logits as megatron_logits

    from maxckpt.reference import forward

    from maxckpt.formats.megatron.files import find_megatron_checkpoint

    spec = tiny_spec("llama3.1", vocab=250)  # GQA: 4 query heads, 2 groups; a vocabulary Megatron pads
    params = random_maxtext_params(spec)
    run = save_maxtext_run(tmp_path / "run", params, step=6).parent
    expected, tokens = forward(params, spec, TOKENS)[0], TOKENS[0]
    results, _ = run_processes(run, tmp_path / "mega", "megatron", 2, "--model", "llama3.1", "--megatron-spec", "local")
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"process {rank} failed:\n{out[-3000:]}"
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    ckpt_dir, iteration = find_megatron_checkpoint(tmp_path / "mega")
    assert sorted(p.name for p in ckpt_dir.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # Megatron asks CUDA for the current device even on CPU-only paths
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(0, inference_rng_tracker=True)
        model = gpt_model(spec, None)  # Megatron-Core's local-spec GPTModel
        state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt_dir), strict="raise_all")
        assert state["iteration"] == iteration == 7
        model.load_state_dict(state["model"], strict=True)
        logits = megatron_logits(model, tokens, spec.vocab_size)
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
        torch.cuda.current_device = current
    assert np.abs(logits - np.asarray(expected)).max() < 1e-4  # Megatron-Core vs maxckpt's JAX reference of MaxText


JOIN_TIMEOUT = 5  # --distributed-timeout of the joining tests: JAX gives up about 5 s after it


def _start(src: Path, dst: Path, port: int, n: int, rank: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "maxckpt", "convert", str(src), str(dst), "--to", "hf", "-q", "--model", "llama3.1",
           "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n), "--process-id", str(rank),
           "--distributed-timeout", str(JOIN_TIMEOUT)]
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ended(procs: list[subprocess.Popen], limit: float = 60) -> tuple[list[tuple[int, list[str]]], float]:
    """(returncode, the `error:` lines) of each process, and the seconds until the last ended."""
    started, out = time.monotonic(), []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=max(1.0, limit - (time.monotonic() - started)))
            assert "Traceback" not in err and "Check failure" not in err, err[-3000:]
            out.append((proc.returncode, [line for line in err.splitlines() if line.startswith("error:")]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return out, time.monotonic() - started


@pytest.mark.multiprocess
def test_a_peer_that_never_starts_is_one_error_after_the_timeout_not_a_jax_abort(maxtext_run, tmp_path):
    (code, errors), = _ended([_start(maxtext_run, tmp_path / "out", free_port(), 2, 0)])[0]
    assert code == 1, errors  # JAX aborted it (SIGABRT, 134, a C++ stack) before
    assert len(errors) == 1 and errors[0].startswith(f"error: process 1 of 2 never joined within {JOIN_TIMEOUT} s"), errors
    assert "--process-id" in errors[0] and "--distributed-timeout" in errors[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.multiprocess
def test_a_process_without_its_coordinator_says_so(maxtext_run, tmp_path):
    port = free_port()
    (code, errors), = _ended([_start(maxtext_run, tmp_path / "out", port, 2, 1)])[0]
    assert code == 1 and len(errors) == 1, errors
    assert errors[0].startswith(f"error: the coordinator at 127.0.0.1:{port} (process 0) did not answer within {JOIN_TIMEOUT} s")


@pytest.mark.multiprocess
def test_processes_given_different_num_processes_both_say_which(maxtext_run, tmp_path):
    port = free_port()
    procs = [_start(maxtext_run, tmp_path / "out", port, 2, 0)]
    time.sleep(0.5)
    procs.append(_start(maxtext_run, tmp_path / "out", port, 3, 1))
    results, seconds = _ended(procs)
    for code, errors in results:
        assert code == 1 and errors == ["error: process 1 says --num-processes 3, process 0 says 2: give every process "
                                        "the same --num-processes"], errors
    assert seconds < 30  # told at once, not after the timeout
    assert not (tmp_path / "out").exists()


@pytest.mark.multiprocess
def test_a_process_id_the_coordinator_does_not_expect_is_refused(maxtext_run, tmp_path):
    port = free_port()
    procs = [_start(maxtext_run, tmp_path / "out", port, 2, 0)]
    time.sleep(0.5)
    procs.append(_start(maxtext_run, tmp_path / "out", port, 3, 2))
    (code0, errors0), (code1, errors1) = _ended(procs)[0]
    assert code1 == 1 and len(errors1) == 1, errors1
    assert errors1[0].startswith("error: process 2 is not one of the processes the coordinator at"), errors1
    assert "give every process the same --num-processes" in errors1[0]
    assert code0 == 1 and errors0[0].startswith("error: process 1 of 2 never joined"), errors0
