"""The storage layer on its own: URLs, kvstore specs, object operations, retries, the Orbax S3 patch."""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorstore as ts

from maxckpt.compat import orbax_s3
from maxckpt.errors import MaxckptError, StorageError
from maxckpt.storage import bucket_store, kvstore, objects, retry
from maxckpt.storage.urls import as_path, is_url, split_url


def test_urls_keep_their_scheme_and_refuse_unknown_ones(tmp_path):
    assert split_url("gs://b/run/checkpoints/") == ("gs", "b", "run/checkpoints")
    assert split_url("/tmp/x") == ("", "", "/tmp/x")
    assert is_url("s3://b") and not is_url(tmp_path)
    p = as_path("gs://b/run") / "checkpoints" / "5"
    assert str(p) == "gs://b/run/checkpoints/5" and p.parent.name == "checkpoints"
    assert as_path(tmp_path) == tmp_path
    with pytest.raises(MaxckptError, match="unsupported storage scheme"):
        split_url("hdfs://nn/x")
    with pytest.raises(MaxckptError, match="no bucket"):
        split_url("gs:///x")


def test_kvstore_spec_per_store(monkeypatch, tmp_path):
    from maxckpt.storage.retry import tensorstore_retries

    monkeypatch.delenv("MAXCKPT_STORAGE_RETRIES", raising=False)
    gcs, s3 = tensorstore_retries("gcs"), tensorstore_retries("s3")
    assert kvstore.kvstore_spec(tmp_path / "a") == {"driver": "file", "path": f"{tmp_path}/a/"}
    assert kvstore.kvstore_spec("gs://b/x/y") == {"driver": "gcs", "bucket": "b", "path": "x/y/", **gcs}
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    assert kvstore.kvstore_spec("s3://b/x") == {"driver": "s3", "bucket": "b", "path": "x/", **s3}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://r2.example:443")  # the S3-specific one wins, as in the AWS SDKs
    monkeypatch.setenv("AWS_REGION", "auto")
    assert kvstore.kvstore_spec("s3://b/x", directory=False) == {
        "driver": "s3", "bucket": "b", "path": "x", "endpoint": "http://r2.example:443", "aws_region": "auto", **s3,
    }


def test_every_store_client_has_bounded_explicit_retries_and_timeouts(monkeypatch):
    """TensorStore's default is 32 retries of up to 32 s (a dead endpoint = minutes); botocore's 60 s x 5 attempts."""
    from maxckpt.storage import retry

    monkeypatch.delenv("MAXCKPT_STORAGE_RETRIES", raising=False)
    monkeypatch.delenv("MAXCKPT_STORAGE_TIMEOUT", raising=False)
    assert retry.tensorstore_retries("s3") == {"s3_request_retries": {"max_retries": 4, "initial_delay": "1s", "max_delay": "10s"}}
    monkeypatch.setenv("MAXCKPT_STORAGE_RETRIES", "2")
    monkeypatch.setenv("MAXCKPT_STORAGE_TIMEOUT", "7")
    assert kvstore.kvstore_spec("gs://b/x")["gcs_request_retries"]["max_retries"] == 2
    s3 = retry.fsspec_options("s3")
    assert s3["config_kwargs"] == {"connect_timeout": 7.0, "read_timeout": 7.0, "retries": {"max_attempts": 3, "mode": "standard"}}
    gcs = retry.fsspec_options("gcs")["requests_timeout"]
    assert (gcs.sock_connect, gcs.sock_read, gcs.total) == (7.0, 7.0, None)
    fs = bucket_store.filesystem("s3://b/x")  # and the filesystems get them (epath's too: fsspec's defaults)
    assert fs.config_kwargs["connect_timeout"] == 7.0
    import fsspec

    assert fsspec.filesystem("s3") is fs
    monkeypatch.setenv("MAXCKPT_STORAGE_TIMEOUT", "soon")
    with pytest.raises(MaxckptError, match="MAXCKPT_STORAGE_TIMEOUT='soon': expected a number"):
        retry.request_timeout()


def test_tensorstore_reads_what_the_object_layer_wrote(bucket_url):
    objects.write_bytes(f"{bucket_url}/dir/blob", b"hello bucket")
    kv = ts.KvStore.open(kvstore.kvstore_spec(f"{bucket_url}/dir")).result()
    assert kv.read(b"blob").result().value == b"hello bucket"


def test_object_operations(bucket_url):
    base = f"{bucket_url}/run"
    objects.write_bytes(f"{base}/a/x.txt", b"x")
    objects.write_bytes(f"{base}/a/deep/y.txt", b"yy")
    objects.write_bytes(f"{base}/top", b"t")
    assert objects.list_names(base) == ["a", "top"]
    assert objects.list_names(f"{base}/missing") == []
    assert [f.rsplit("/", 1)[1] for f in objects.find_files(f"{base}/a")] == ["y.txt", "x.txt"]
    assert objects.total_bytes(base) == 4
    payload = np.random.default_rng(0).integers(0, 255, 40 << 20, dtype=np.uint8)
    with objects.open_write(f"{base}/big") as f:  # a multipart upload
        f.write(payload.tobytes())
    assert objects.size(f"{base}/big") == payload.nbytes
    out = bytearray(30 << 20)
    assert objects.read_into(f"{base}/big", 5 << 20, memoryview(out), part=4 << 20) == len(out)
    assert bytes(out) == payload[5 << 20:35 << 20].tobytes()
    objects.rmtree(f"{base}/a")
    assert objects.list_names(base) == ["big", "top"]


class _Flaky:
    """Wraps a real fsspec filesystem; each listed method fails `times` times with `error`, then works."""

    def __init__(self, fs, error, times, methods=("pipe_file", "cat_file", "ls", "rm", "find", "size", "cat_ranges")):
        self._fs, self._error, self._left, self.calls = fs, error, {m: times for m in methods}, []

    def __getattr__(self, name):
        real = getattr(self._fs, name)
        if name not in self._left:
            return real

        def call(*args, **kwargs):
            self.calls.append(name)
            if self._left[name] > 0:
                self._left[name] -= 1
                raise self._error
            return real(*args, **kwargs)

        return call


def _transient(scheme):
    if scheme == "gs":
        from gcsfs.retry import HttpError

        return HttpError({"code": 503, "message": "Service Unavailable"})
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                        "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")


def test_transient_errors_are_retried(bucket_url, monkeypatch):
    scheme = split_url(bucket_url).scheme
    real = bucket_store.filesystem(bucket_url)
    flaky = _Flaky(real, _transient(scheme), times=2)
    monkeypatch.setattr(bucket_store, "filesystem", lambda path: flaky)
    monkeypatch.setattr(retry, "BASE_DELAY_S", 0.01)
    objects.write_bytes(f"{bucket_url}/k", b"v")
    assert objects.read_bytes(f"{bucket_url}/k") == b"v"
    assert objects.list_names(bucket_url) == ["k"]
    out = bytearray(1)
    assert objects.read_into(f"{bucket_url}/k", 0, memoryview(out)) == 1
    objects.delete_files([f"{bucket_url}/k"])
    assert flaky.calls.count("pipe_file") == 3 and flaky.calls.count("cat_file") == 3
    assert flaky.calls.count("rm") == 3 and flaky.calls.count("cat_ranges") == 3
    monkeypatch.setattr(bucket_store, "filesystem", lambda path: real)
    assert objects.list_names(bucket_url) == []


def test_a_permanent_error_is_one_clear_error_without_retries(bucket_url, monkeypatch):
    from gcsfs.retry import HttpError

    flaky = _Flaky(bucket_store.filesystem(bucket_url), HttpError({"code": 403, "message": "caller does not have storage.objects.create access"}), times=99)
    monkeypatch.setattr(bucket_store, "filesystem", lambda path: flaky)
    with pytest.raises(StorageError, match=r"write .*/k failed: HttpError: caller does not have") as info:
        objects.write_bytes(f"{bucket_url}/k", b"v")
    assert flaky.calls == ["pipe_file"]
    assert isinstance(info.value, OSError)  # retention treats it like any file-system error: warn, retry next pass


def test_transient_errors_that_outlast_the_retries_say_so(monkeypatch):
    calls = []

    def always_503():
        calls.append(1)
        raise TimeoutError("read timed out")

    with pytest.raises(StorageError, match="failed 3 times with transient errors"):
        retry.with_retries(always_503, what="read", path="gs://b/x", attempts=3, sleep=lambda s: None)
    assert len(calls) == 3
    for status, transient in ((429, True), (500, True), (503, True), (404, False), (403, False)):
        err = Exception("x")
        err.code = status  # type: ignore[attr-defined]
        assert retry.is_transient(err) is transient, status
    assert not retry.is_transient(FileNotFoundError("gone"))


def test_orbax_s3_patch_checks_the_orbax_internals_it_relies_on(monkeypatch):
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    orbax_s3._check(tsu)  # the installed Orbax has what the patch needs
    fake = types.SimpleNamespace(_normalize_path=tsu._normalize_path, gcs_utils=tsu.gcs_utils)
    with pytest.raises(RuntimeError, match="update maxckpt/compat/orbax_s3.py"):
        orbax_s3._check(fake)
    orbax_s3.install()
    # Installed: s3:// URLs get the s3 driver with the configured endpoint; gs:// and local paths are Orbax's own.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    spec = tsu.build_kvstore_tspec("s3://bkt/run/0/items", use_ocdbt=True)
    assert spec["base"]["driver"] == "s3" and spec["base"]["bucket"] == "bkt" and spec["base"]["endpoint"] == "http://127.0.0.1:9"
    assert tsu.build_kvstore_tspec("gs://bkt/run/0/items", use_ocdbt=True)["base"]["driver"] == "gcs"
    assert tsu.build_kvstore_tspec("/tmp/run/0/items", use_ocdbt=True)["base"]["driver"] == "file"


def test_a_missing_bucket_is_one_clear_error(object_stores, tmp_path, capsys):
    from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
    from cli_runner import run_cli
    from maxckpt import CheckpointManager

    run = save_maxtext_run(tmp_path / "run", random_maxtext_params(tiny_spec("llama2")))
    for scheme in ("gs", "s3"):
        code, out, err = run_cli(["convert", run, f"{scheme}://no-such-bucket/x", "--to", "hf", "--model", "llama2"], capsys)
        assert code == 1 and err.strip().splitlines() == [
            f"error: {scheme}://no-such-bucket/x: the bucket {scheme}://no-such-bucket does not exist or these "
            "credentials cannot see it; create it, or check the URL and the credentials"
        ], err
        with pytest.raises(StorageError, match="does not exist"):
            CheckpointManager(f"{scheme}://no-such-bucket/run/checkpoints")
    code, out, err = run_cli(["ls", "hdfs://nn/run"], capsys)
    assert code == 1 and "unsupported storage scheme hdfs://" in err
