"""Writing a conversion's output to a bucket: data first, a completion marker last.

On a disk, `convert` writes to ``DST.tmp-*`` and renames it into place. A
bucket cannot rename, so an output there is written in place and committed
by markers:

1. ``DST/.maxckpt-writing`` (who is writing, since when) goes first;
2. the tensors and sidecar files follow;
3. ``DST/.maxckpt-complete`` is written last, then the ``writing`` record is
   removed.

A DST with the ``writing`` record and no ``complete`` marker is a conversion
that died: readers refuse it (:func:`refuse_partial`) and the next `convert`
to the same DST removes it before writing (:func:`bucket_output`). A single
file (``gs://b/model.pt``) is one object, and an object appears whole or not
at all, so it needs no markers.

Formats whose writer speaks to buckets natively (MaxText/Orbax through
TensorStore) write straight into DST. The others write into a local spool
folder and each finished file is uploaded (a streamed multipart upload) and
removed from the spool.

A multi-process conversion (:mod:`maxckpt.conversion.distributed`) uses the
same pieces apart: process 0 calls :func:`begin`, every process writes its
share through :func:`spooled` into the same DST, small files a process must
hand to process 0 go through the bucket (:func:`write_small`,
:func:`read_small`), and process 0 calls :func:`commit` (or :func:`abandon`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
from typing import IO, Iterator

from etils import epath

from maxckpt.errors import CheckpointNotFoundError, ConversionError
from maxckpt.storage import deletion, objects
from maxckpt.storage.urls import as_path, is_url

WRITING = ".maxckpt-writing"
COMPLETE = ".maxckpt-complete"
# Targets whose writer writes to a bucket itself (TensorStore); the others go through a local spool.
NATIVE_FORMATS = ("maxtext",)


def is_partial_output(path: str | os.PathLike) -> bool:
    """True for a bucket DST that a conversion began writing and never completed."""
    if not is_url(path):
        return False
    return objects.exists(f"{os.fspath(path)}/{WRITING}") and not objects.exists(f"{os.fspath(path)}/{COMPLETE}")


def refuse_partial(path: str | os.PathLike) -> None:
    """Raise CheckpointNotFoundError when `path` is an unfinished conversion output on a bucket."""
    if is_partial_output(path):
        raise CheckpointNotFoundError(
            f"{path} is an unfinished conversion output ({WRITING} without {COMPLETE}: the conversion "
            "died before it completed); convert again to the same destination to replace it"
        )


# Spool folders of conversions in progress -> the bucket URL each stands for.
_SPOOLS: dict[str, str] = {}


def _bucket_url_of(path: str | os.PathLike) -> str | None:
    text = os.path.abspath(os.fspath(path))
    for spool, url in _SPOOLS.items():
        if text == spool or text.startswith(spool + os.sep):
            return url + text[len(spool):].replace(os.sep, "/")
    return None


def open_output(path: str | os.PathLike) -> IO[bytes]:
    """Open a file a writer fills sequentially: inside a bucket conversion's spool, a streamed
    multipart upload straight to the bucket (nothing on local disk); elsewhere a local file."""
    url = _bucket_url_of(path)
    return objects.open_write(url) if url else open(path, "wb")


def file_done(path: str | os.PathLike) -> None:
    """A writer finished `path`: inside a bucket conversion's spool it is uploaded and removed now,
    so the spool holds only files still being written (one shard, not the model)."""
    url = _bucket_url_of(path)
    if url and os.path.isfile(path):
        _upload_file(os.fspath(path), url)


def _remove(dst: str) -> None:
    """Remove everything under `dst` crash-safely (intent first), then the intent record."""
    deletion.finish(deletion.record_intent(dst))


def _upload_tree(local: str, dst: str) -> None:
    """Upload every file below `local` to `dst` (same relative names), deleting each once it is up."""
    if os.path.isfile(local):
        _upload_file(local, dst)
        return
    for root, _dirs, files in os.walk(local):
        for name in sorted(files):
            src = os.path.join(root, name)
            rel = os.path.relpath(src, local).replace(os.sep, "/")
            _upload_file(src, f"{dst}/{rel}")


def _upload_file(src: str, dst: str) -> None:
    with open(src, "rb") as f, objects.open_write(dst) as out:
        shutil.copyfileobj(f, out, 16 << 20)
    os.remove(src)  # the spool never holds more than the files not yet uploaded


def _is_single_file(dst_text: str) -> bool:
    return os.path.splitext(dst_text)[1] in (".pt", ".pth", ".bin", ".safetensors")


def begin(dst: str | os.PathLike, overwrite: bool = False) -> str:
    """Make `dst` (a bucket URL) ready for a conversion's output; returns its normalised URL.

    Applies the overwrite rules (debris of a conversion that died is removed
    either way; an existing output only with `overwrite`), then writes the
    ``writing`` record, so from here on a crash leaves recognisable partial output.
    """
    dst_text = os.fspath(as_path(dst))
    objects.require_bucket(dst_text)
    single_file = _is_single_file(dst_text)
    present = objects.list_names(dst_text) if not single_file else ([dst_text] if objects.exists(dst_text) else [])
    if present:
        if not single_file and is_partial_output(dst_text):
            _remove(dst_text)  # debris of a conversion that died: ours to clean
        elif not overwrite:
            raise ConversionError(f"{dst_text} already exists; choose another destination or pass --overwrite")
        elif single_file:
            pass  # one object is replaced whole by the upload
        else:
            # A bucket cannot swap folders: the old output goes before the new one is written.
            _remove(dst_text)
    if not single_file:
        record = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        objects.write_bytes(f"{dst_text}/{WRITING}", json.dumps(record).encode())
    return dst_text


def commit(dst: str | os.PathLike) -> None:
    """Mark the finished output `dst` complete: the ``complete`` marker, then the ``writing`` record goes."""
    dst_text = os.fspath(as_path(dst))
    if not _is_single_file(dst_text):
        objects.write_bytes(f"{dst_text}/{COMPLETE}", json.dumps({"completed": time.time()}).encode())
        objects.delete_files([f"{dst_text}/{WRITING}"])


def abandon(dst: str | os.PathLike, *, native: bool = False) -> None:
    """Remove what a failed conversion wrote to `dst`; best effort (a crash leaves the ``writing`` record)."""
    dst_text = os.fspath(as_path(dst))
    with contextlib.suppress(Exception):  # the conversion's own error is what the user must see
        if not _is_single_file(dst_text):
            _remove(dst_text)  # nothing half-written stays behind
        elif native:
            objects.delete_files([dst_text])


@contextlib.contextmanager
def spooled(dst: str | os.PathLike, *, native: bool = False) -> Iterator[epath.Path]:
    """Yield where a writer writes its part of `dst` (a bucket URL); upload what is left in the spool on success.

    `native=True`: the writer writes to the bucket itself (yields `dst`).
    Otherwise a local spool path that does not exist yet: files the writer
    streams (:func:`open_output`) or finishes (:func:`file_done`) go up at
    once, the rest when the block ends. Markers are not this function's job
    (:func:`begin`, :func:`commit`), so each process of a multi-process
    conversion spools its own share into the same `dst`.
    """
    dst_text = os.fspath(as_path(dst))
    if native:
        yield as_path(dst_text)
        return
    spool_root = tempfile.mkdtemp(prefix="maxckpt-spool-")
    target = as_path(os.path.join(spool_root, os.path.basename(dst_text)))
    _SPOOLS[os.path.abspath(os.fspath(target))] = dst_text
    try:
        yield target
        _upload_tree(os.fspath(target), dst_text)
    finally:
        _SPOOLS.pop(os.path.abspath(os.fspath(target)), None)
        shutil.rmtree(spool_root, ignore_errors=True)


@contextlib.contextmanager
def bucket_output(dst: str | os.PathLike, overwrite: bool = False, *, native: bool = False) -> Iterator[epath.Path]:
    """Yield where a writer should write `dst` (a bucket URL); commit it with the markers on success.

    `native=True`: the writer writes to the bucket itself (yields `dst`).
    Otherwise it writes into a local spool path that does not exist yet, and
    the files are uploaded afterwards. A failed conversion removes what it wrote.
    """
    dst_text = begin(dst, overwrite)
    try:
        with spooled(dst_text, native=native) as target:
            yield target
            if not native and not os.path.exists(os.fspath(target)):
                raise ConversionError(f"the writer produced nothing for {dst_text}")
        commit(dst_text)
    except BaseException:
        abandon(dst_text, native=native)
        raise


# ------------------------------------------------ files a writer shares with other processes


def write_small(path: str | os.PathLike, data: bytes) -> None:
    """Write a small file durably: inside a bucket conversion's spool, straight to its object in the bucket."""
    url = _bucket_url_of(path)
    if url:
        objects.write_bytes(url, data)
        return
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_small(path: str | os.PathLike) -> bytes:
    """Read a small file another process of the conversion wrote (:func:`write_small`), from the bucket in a spool."""
    url = _bucket_url_of(path)
    return objects.read_bytes(url) if url else objects.read_bytes(os.fspath(path))


def where(path: str | os.PathLike) -> str:
    """How to name `path` to a user: inside a bucket conversion's spool, the bucket URL it stands for."""
    return _bucket_url_of(path) or os.fspath(path)


def output_names(directory: str | os.PathLike) -> set[str]:
    """Names of the files in a folder of the output (one listing); in a spool, of the objects in the bucket,
    which every process of the conversion uploads to."""
    url = _bucket_url_of(directory)
    if url:
        return set(objects.list_names(url))
    return {e.name for e in os.scandir(directory) if e.is_file()} if os.path.isdir(directory) else set()


def remove_output(path: str | os.PathLike) -> None:
    """Remove a file of the output (in a spool: its object in the bucket); an absent one is fine."""
    url = _bucket_url_of(path)
    if url:
        objects.delete_files([url])
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
