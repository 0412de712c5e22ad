"""Teach Orbax 0.12 to write and read ``s3://`` checkpoints (its TensorStore specs know only ``gs://``).

Orbax goes through epath (fsspec's s3fs) for its small files, which works on
S3, but builds TensorStore specs for the arrays itself, and there it only
knows ``gs://``: any other URL becomes a local ``file`` path (``s3:/b/x``).
TensorStore has an ``s3`` driver; what is missing is the mapping. :func:`install`
replaces three private helpers of ``orbax.checkpoint._src.serialization.tensorstore_utils``:

- ``_normalize_path`` keeps ``s3://`` (``os.path.normpath`` folds it to ``s3:/``);
- ``_use_gcs_driver`` answers yes for ``s3://`` ("not a local file path");
- ``gcs_utils.get_kvstore_for_gcs`` (as that module sees it) returns
  :func:`maxckpt.storage.kvstore.kvstore_spec`'s ``s3`` spec for ``s3://``,
  with the endpoint users configured (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``).

``gs://`` and local paths go to Orbax's own code (gs:// specs get maxckpt's bounded retries). S3 cannot rename
folders, so managers on ``s3://`` also pass Orbax's ``CommitFileTemporaryPath`` (:func:`temporary_path_class`),
as Orbax does by itself for ``gs://``: the step is written in place and ``commit_success.txt`` is written last.

:func:`install` checks that the helpers still exist with the shape this relies on and raises otherwise;
``tests/test_storage/test_storage.py`` checks the helpers, and ``tests/test_manager/test_storage_manager.py`` and
``tests/test_conversion/test_convert_distributed_bucket.py`` save and restore through Orbax on a real S3 server.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any

from maxckpt.compat.versions import installed_version, written_for
from maxckpt.storage.kvstore import kvstore_spec
from maxckpt.storage.retry import tensorstore_retries
from maxckpt.storage.urls import split_url

_LOCK = threading.Lock()
_INSTALLED = False


class _GcsOrS3Utils:
    """Orbax's gcs_utils as tensorstore_utils sees it, with an s3 branch in get_kvstore_for_gcs."""

    def __init__(self, gcs_utils: Any) -> None:
        self._gcs_utils = gcs_utils

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gcs_utils, name)

    def get_kvstore_for_gcs(self, ckpt_path: str) -> dict[str, Any]:
        if str(ckpt_path).startswith("s3://"):
            return kvstore_spec(ckpt_path, directory=False)
        spec = self._gcs_utils.get_kvstore_for_gcs(ckpt_path)
        if isinstance(spec, dict) and spec.get("driver") == "gcs":  # bounded retries (maxckpt.storage.retry), not 32
            spec = {**tensorstore_retries("gcs"), **spec}
        return spec


def _check(tsu: Any) -> None:
    missing = [n for n in ("_normalize_path", "_use_gcs_driver", "gcs_utils", "_build_ocdbt_kvstore_tspec",
                           "_build_non_ocdbt_kvstore_tspec") if not hasattr(tsu, n)]
    if missing or not hasattr(tsu.gcs_utils, "get_kvstore_for_gcs"):
        raise RuntimeError(
            "maxckpt's s3:// support for Orbax relies on orbax.checkpoint._src.serialization.tensorstore_utils."
            f"{{_normalize_path, _use_gcs_driver, gcs_utils.get_kvstore_for_gcs}}, which this Orbax "
            f"({_orbax_version()}) changed (missing: {missing or ['gcs_utils.get_kvstore_for_gcs']}); "
            "update maxckpt/compat/orbax_s3.py"
        )
    for name in ("_build_ocdbt_kvstore_tspec", "_build_non_ocdbt_kvstore_tspec"):
        source = inspect.getsource(getattr(tsu, name))
        if "_use_gcs_driver(" not in source or "get_kvstore_for_gcs(" not in source or "_normalize_path(" not in source:
            raise RuntimeError(
                f"Orbax {_orbax_version()}: tensorstore_utils.{name} no longer builds its base kvstore through "
                "_normalize_path/_use_gcs_driver/gcs_utils.get_kvstore_for_gcs; update maxckpt/compat/orbax_s3.py"
            )


def _orbax_version() -> str:
    return installed_version("orbax-checkpoint") or "unknown version"


def install() -> None:
    """Make Orbax's TensorStore specs follow ``s3://`` URLs (idempotent, thread-safe).

    Another Orbax release than the one this was written for is warned about once
    (:func:`~maxckpt.compat.versions.written_for`); the check of the helpers then decides, as on 0.12.
    """
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        written_for("orbax-checkpoint")
        from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

        _check(tsu)
        normalize, use_gcs = tsu._normalize_path, tsu._use_gcs_driver

        def _normalize_path(path: str) -> str:
            text = normalize(path)
            return "s3://" + text[len("s3:/"):] if text.startswith("s3:/") and not text.startswith("s3://") else text

        def _use_gcs_driver(directory: str) -> bool:
            return str(directory).startswith("s3://") or use_gcs(directory)

        tsu._normalize_path = _normalize_path
        tsu._use_gcs_driver = _use_gcs_driver
        tsu.gcs_utils = _GcsOrS3Utils(tsu.gcs_utils)
        _INSTALLED = True


def temporary_path_class(directory: str | os.PathLike) -> Any:
    """The Orbax temporary-path class a manager on `directory` needs: None (Orbax's default) except on S3."""
    if split_url(directory).scheme != "s3":
        return None
    install()
    from orbax.checkpoint.path import atomicity  # the public name (orbax.checkpoint.path)

    return atomicity.CommitFileTemporaryPath
