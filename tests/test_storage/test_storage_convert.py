"""convert, inspect, ls, diff, verify and prune on gs:// and s3:// (real fake-gcs-server and moto).

Every format goes local -> bucket -> bucket -> local and comes back bit for
bit; a conversion that dies halfway leaves a DST that readers refuse and the
next conversion replaces; transient store errors are retried.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_runner import run_cli
from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
from maxckpt.formats import HFOptions
from maxckpt.containers.orbax import OrbaxReader
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.errors import CheckpointNotFoundError, ConversionError
from maxckpt.storage.ownership import owner_record
from maxckpt.storage import objects, outputs
from maxckpt.storage.run_dirs import scan_run_dir

FORMATS = ["maxtext", "hf", "megatron", "torchtitan", "torch"]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    spec = tiny_spec("llama2")
    params = random_maxtext_params(spec, seed=7)
    run = save_maxtext_run(root / "run", params, step=4).parent
    return run, params


def _assert_params(path, params) -> None:
    r = OrbaxReader(path)
    stored = {name: r.read(name) for name in r.tensors()}
    assert set(stored) == {"params/params/" + n for n in params}
    for name, array in params.items():
        got = stored["params/params/" + name]
        assert got.dtype == array.dtype and np.array_equal(got, array), name


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_local_to_bucket_to_bucket_to_local_is_exact(bucket_url, local_run, tmp_path, fmt):
    run, params = local_run
    first = f"{bucket_url}/export/{fmt}"
    report = convert(run, first, to=fmt, model="llama2")
    assert report.bytes == sum(a.nbytes for a in params.values())
    names = objects.list_names(first)
    assert outputs.COMPLETE in names and outputs.WRITING not in names
    # bucket -> bucket (as MaxText again), then bucket -> local disk.
    again = f"{bucket_url}/back/maxtext-from-{fmt}"
    convert(first, again, to="maxtext", model="llama2")
    _assert_params(again, params)
    local = tmp_path / "local"
    convert(again, local, to=fmt, model="llama2")
    convert(local, tmp_path / "mt", to="maxtext", model="llama2")
    _assert_params(tmp_path / "mt", params)


def test_existing_bucket_destination_is_kept_unless_overwrite(bucket_url, local_run):
    run, params = local_run
    dst = f"{bucket_url}/hf"
    convert(run, dst, to="hf", model="llama2")
    before = objects.find_files(dst)
    with pytest.raises(ConversionError, match="already exists"):
        convert(run, dst, to="hf", model="llama2")
    assert objects.find_files(dst) == before
    convert(run, dst, to="hf", model="llama2", overwrite=True)
    assert sorted(objects.list_names(dst)) == sorted(n.rsplit("/", 1)[1] for n in before)


def test_overwrite_on_a_bucket_replaces_only_a_checkpoint_and_never_the_source(bucket_url, local_run):
    """The --overwrite rules hold on buckets too: objects that are no checkpoint, or the source, survive."""
    run, _ = local_run
    notes = f"{bucket_url}/notes"
    objects.write_bytes(f"{notes}/todo.txt", b"not a checkpoint")
    with pytest.raises(ConversionError, match="nor a checkpoint maxckpt recognises"):
        convert(run, notes, to="hf", model="llama2", overwrite=True)
    assert objects.read_bytes(f"{notes}/todo.txt") == b"not a checkpoint"
    src = f"{bucket_url}/src"
    convert(run, src, to="maxtext", model="llama2")
    before = objects.find_files(src)
    for dst, why in ((src, "is or holds the source"), (f"{src}/4/hf", "is inside the source")):
        with pytest.raises(ConversionError, match=why):
            convert(src, dst, to="hf", model="llama2", overwrite=True)
    assert objects.find_files(src) == before


def test_a_conversion_that_died_is_refused_then_replaced(bucket_url, local_run, tmp_path):
    run, params = local_run
    dst = f"{bucket_url}/mt"
    convert(run, dst, to="maxtext", model="llama2")
    # What a conversion killed halfway leaves: its writing record (an owner that is gone), its journal of the
    # entries it began, some data, no completion marker.
    objects.delete_files([f"{dst}/{outputs.COMPLETE}"])
    record = {**outputs._new_record(dst), "owner": {**owner_record(), "process_start": -1}}  # this pid, another process
    objects.write_bytes(f"{dst}/{outputs.WRITING}", json.dumps(record).encode())
    objects.write_bytes(f"{dst}/{outputs.JOURNAL}/{record['token']}/0", b"")
    with pytest.raises(CheckpointNotFoundError, match="unfinished conversion output"):
        open_checkpoint(dst)
    convert(run, dst, to="maxtext", model="llama2")  # no --overwrite needed: the debris is ours
    assert outputs.WRITING not in objects.list_names(dst) and outputs.JOURNAL not in objects.list_names(dst)
    _assert_params(dst, params)


def test_a_failing_writer_leaves_nothing_on_the_bucket(bucket_url, local_run, monkeypatch):
    run, _ = local_run
    from maxckpt.storage import outputs as out_mod

    def broken(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(out_mod, "_upload_file", broken)
    dst = f"{bucket_url}/broken"
    with pytest.raises(OSError, match="disk on fire"):
        convert(run, dst, to="hf", model="llama2")
    assert objects.find_files(dst) == []


def test_inspect_ls_diff_verify_prune_on_a_bucket(bucket_url, local_run, capsys):
    from maxckpt import CheckpointManager
    from manager_states import make_state

    run, _ = local_run
    hf = f"{bucket_url}/hf"
    mt = f"{bucket_url}/mt"
    convert(run, hf, to="hf", model="llama2")
    convert(hf, mt, to="maxtext")
    code, out, err = run_cli(["inspect", hf, "--json"], capsys)
    assert code == 0, out + err
    assert "model.layers.0.self_attn.q_proj.weight" in out
    code, out, err = run_cli(["diff", str(run), mt, "--json"], capsys)
    assert code == 0, out + err
    code, out, err = run_cli(["verify", str(run), hf, "--model", "llama2"], capsys)
    assert code == 0, out + err
    ckpts = f"{bucket_url}/run/checkpoints"
    with CheckpointManager(ckpts, period=1, async_save=False) as mgr:
        for step in range(4):
            mgr.save(step, make_state(step))
    code, out, err = run_cli(["ls", ckpts, "--json"], capsys)
    assert code == 0, out + err
    rows = json.loads(out)["steps"]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(r["bytes"] > 0 for r in rows)
    code, out, err = run_cli(["prune", ckpts, "--keep", "2"], capsys)
    assert code == 0, out + err
    assert [s.step for s in scan_run_dir(ckpts).steps] == [2, 3]
    assert objects.list_names(ckpts) == ["2", "3"]


def test_writing_to_a_bucket_never_stages_the_whole_model_locally(bucket_url, local_run, monkeypatch, tmp_path):
    """Safetensors shards are uploaded as each completes; the DCP data file streams straight to the bucket."""
    run, params = local_run
    total = sum(a.nbytes for a in params.values())
    real_upload = outputs._upload_file
    seen: list[tuple[str, int]] = []

    def spy(src, dst):
        spool = src.split("/maxckpt-spool-")[0] + "/maxckpt-spool-" + src.split("/maxckpt-spool-")[1].split("/")[0]
        staged = sum(p.stat().st_size for p in __import__("pathlib").Path(spool).rglob("*") if p.is_file())
        seen.append((dst.rsplit("/", 1)[1], staged))
        real_upload(src, dst)

    monkeypatch.setattr(outputs, "_upload_file", spy)
    shard = total // 5
    convert(run, f"{bucket_url}/hf", to="hf", model="llama2", options=HFOptions(max_shard_size=shard))
    shards = [name for name, _ in seen if name.endswith(".safetensors")]
    assert len(shards) >= 4
    assert max(staged for _, staged in seen) <= 2 * shard, seen  # one shard (a big tensor may overshoot one)
    seen.clear()
    convert(run, f"{bucket_url}/mcore", to="megatron", model="llama2")
    assert not any(name.endswith(".distcp") for name, _ in seen)  # streamed, never spooled
    assert max(staged for _, staged in seen) < total // 4
    assert objects.exists(f"{bucket_url}/mcore/iter_0000005/__0_0.distcp")
    convert(f"{bucket_url}/mcore", tmp_path / "mt", to="maxtext", model="llama2")
    _assert_params(tmp_path / "mt", params)


def test_sigkill_during_a_conversion_to_a_bucket(bucket_url, local_run, tmp_path):
    """Killed after its first shard is up: DST is refused as unfinished, then the next convert replaces it."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    run, params = local_run
    dst = f"{bucket_url}/hf"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "tests")])}
    proc = subprocess.run(
        [sys.executable, str(repo / "tests" / "procs" / "bucket_convert.py"), str(run), dst, "hf"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "UPLOADED" in proc.stdout and "NOT KILLED" not in proc.stdout
    names = objects.list_names(dst)
    assert outputs.WRITING in names and outputs.COMPLETE not in names
    assert any(n.endswith(".safetensors") for n in names)  # part of the model is up
    with pytest.raises(CheckpointNotFoundError, match="unfinished conversion output"):
        open_checkpoint(dst)
    convert(run, dst, to="hf", model="llama2")  # replaces the debris without --overwrite
    convert(dst, tmp_path / "mt", to="maxtext")
    _assert_params(tmp_path / "mt", params)
    assert outputs.WRITING not in objects.list_names(dst)


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_ls_and_prune_a_framework_run_on_a_bucket(bucket_url, local_run, fmt, capsys):
    run, _ = local_run
    dst = f"{bucket_url}/{fmt}"
    convert(run, dst, to=fmt, model="llama2")
    code, out, err = run_cli(["ls", dst, "--json"], capsys)
    assert code == 0, out + err
    (row,) = json.loads(out)["steps"]
    assert row["state"] == "committed" and row["step"] == 5 and row["bytes"] > 0 and row["saved_at"]
    code, out, err = run_cli(["prune", dst, "--keep", "1", "--dry-run"], capsys)
    assert code == 0, out + err
    assert "maxckpt conversion marker" in out


def test_a_run_on_a_bucket_remembers_its_model_settings(bucket_url, tmp_path):
    """CheckpointManager(model_config=...) records the run's MaxText keys beside checkpoints/ on the bucket;
    convert of the bucket run then needs no --model or --set and uses the run's rope theta, not the preset's."""
    from conversion_models import nest

    from maxckpt import CheckpointManager

    spec = tiny_spec("llama2")
    params = random_maxtext_params(spec, seed=3)
    run = f"{bucket_url}/remembering"
    model_config = {"model_name": "llama2-7b", "override_model_config": True, "base_emb_dim": 32,
                    "base_num_query_heads": 4, "base_num_kv_heads": 2, "head_dim": 16, "base_mlp_dim": 64,
                    "base_num_decoder_layers": 2, "vocab_size": 128, "rope_max_timescale": 5000}
    with CheckpointManager(f"{run}/checkpoints", async_save=False, model_config=model_config) as mgr:
        mgr.save(0, {"params": {"params": nest(params)}, "step": np.int32(1)}, force=True)
    assert "maxckpt_run_config.yml" in objects.list_names(run)
    report = convert(run, tmp_path / "hf", to="hf")
    assert report.spec.family == "llama2" and report.spec.rope_theta == 5000
    assert not [n for n in report.notes if n.startswith("assumed from")], report.notes
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config.get("rope_theta", config.get("rope_parameters", {}).get("rope_theta")) == 5000
