"""Writing a conversion's output to a bucket: data first, a completion marker last, an owner throughout.

Why: a bucket cannot rename, so an output there is written in place and committed by markers:
``DST/.maxckpt-writing`` (owner, token, lease) first, each top-level entry journaled before its data,
``DST/.maxckpt-complete`` last. Readers refuse a DST without the marker (:func:`refuse_partial`); the next
:func:`begin` refuses while the owner lives and removes only the journaled entries once it is gone. Native bucket
writers journal through :func:`claim`, the others upload from a local spool (:func:`spooled`); process 0 of a
multi-process conversion calls :func:`begin` and :func:`commit`. See docs/design/bucket-outputs.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.parse
import uuid
from typing import IO, Iterator

from etils import epath

from maxckpt.errors import CheckpointNotFoundError, ConversionError
from maxckpt.storage import deletion, objects
from maxckpt.storage.ownership import owner_alive, owner_record
from maxckpt.storage.urls import as_path, is_url

WRITING = ".maxckpt-writing"
COMPLETE = ".maxckpt-complete"
JOURNAL = ".maxckpt-writing-entries"
MARKERS = (WRITING, COMPLETE, JOURNAL)
RECORD_KIND = "maxckpt bucket output"
RECORD_VERSION = 2
RECORD_MAX_BYTES = 64 * 1024
LEASE_S = 60.0  # a writer on another host that has not renewed its record for this long is taken for dead
RENEW_S = 15.0  # how often a live writer renews its lease (four renewals per lease: a few failed requests are fine)
SETTLE_S = 0.5  # how long a new writer waits before reading its record back (two writers starting together)
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
    if url:
        claim(url)
        return objects.open_write(url)
    return open(path, "wb")


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
    claim(dst)
    with open(src, "rb") as f, objects.open_write(dst) as out:
        shutil.copyfileobj(f, out, 16 << 20)
    os.remove(src)  # the spool never holds more than the files not yet uploaded


def _is_single_file(dst_text: str) -> bool:
    return os.path.splitext(dst_text)[1] in (".pt", ".pth", ".bin", ".safetensors")


# ------------------------------------------------------------- the writing record


def _record_url(dst_text: str) -> str:
    return f"{dst_text}/{WRITING}"


def _journal_url(dst_text: str, token: str) -> str:
    return f"{dst_text}/{JOURNAL}/{token}"


def _read_record(dst_text: str) -> tuple[str, dict | None]:
    """("absent", None), ("ours", record) for a record maxckpt wrote for `dst_text`, or ("foreign", None)."""
    url = _record_url(dst_text)
    try:
        if objects.size(url) > RECORD_MAX_BYTES:
            return "foreign", None
        record = json.loads(objects.read_bytes(url))
    except FileNotFoundError:
        return "absent", None
    except (ValueError, UnicodeDecodeError):
        return "foreign", None
    valid = (
        isinstance(record, dict)
        and record.get("kind") == RECORD_KIND
        and record.get("version") == RECORD_VERSION
        and record.get("dst") == dst_text
        and isinstance(record.get("token"), str)
        and len(record["token"]) == 32
        and all(c in "0123456789abcdef" for c in record["token"])
        and isinstance(record.get("owner"), dict)
    )
    return ("ours", record) if valid else ("foreign", None)


def _new_record(dst_text: str) -> dict:
    now = time.time()
    return {
        "kind": RECORD_KIND, "version": RECORD_VERSION, "dst": dst_text, "token": uuid.uuid4().hex,
        "owner": owner_record(), "since": now, "renewed": now, "lease_s": LEASE_S,
    }


def _write_record(record: dict) -> None:
    objects.write_bytes(_record_url(record["dst"]), json.dumps(record).encode())


def _writer_alive(record: dict) -> tuple[bool, str]:
    """Whether the writer of `record` may still be writing, and who it is, for a message."""
    owner = record["owner"]
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record.get("since") or 0)))
    who = f"pid {owner.get('pid')} on host {owner.get('host')}, since {since}"
    alive = owner_alive(owner)
    if alive is not None:
        return alive, who
    # Another host: its lease. The record's own time (the writer's clock) or the store's, whichever is later.
    renewed = float(record.get("renewed") or 0)
    with contextlib.suppress(OSError, ValueError):
        renewed = max(renewed, objects.mtime(_record_url(record["dst"])))
    left = renewed + float(record.get("lease_s") or LEASE_S) - time.time()
    return left > 0, who + (f"; its lease runs out in {left:.0f} s unless it renews it" if left > 0 else "")


class _Lease:
    """Renews a writing record while its conversion runs, and notices when another writer replaced it."""

    def __init__(self, record: dict) -> None:
        self.record = record
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="maxckpt-writing-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        dst_text = self.record["dst"]
        while not self._stop.wait(RENEW_S):
            try:
                state, found = _read_record(dst_text)
                if self._stop.is_set():
                    return
                if state != "ours" or found["token"] != self.record["token"]:
                    self.lost = (
                        f"{dst_text}: another conversion replaced this one's writing record (this one could not "
                        f"renew its lease for {LEASE_S:.0f} s); this output was not committed and nothing was removed"
                    )
                    return
                self.record = {**self.record, "renewed": time.time()}
                _write_record(self.record)
            except Exception:  # noqa: BLE001 - the store failing now: renew next time, the lease covers several misses
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# DST URL -> the token this process writes under (every process of a conversion), and process 0's lease.
_TOKENS: dict[str, str] = {}
_LEASES: dict[str, _Lease] = {}
_CLAIMED: set[tuple[str, str]] = set()


def claim(path: str | os.PathLike) -> None:
    """Journal the top-level entry of `path` before its first object is written, when `path` lies inside a
    bucket output this process is writing; elsewhere nothing. Raises ConversionError once the output was lost."""
    text = os.fspath(path) if is_url(path) else None
    if text is None:
        return
    for dst_text, token in list(_TOKENS.items()):
        if not text.startswith(dst_text + "/"):
            continue
        entry = text[len(dst_text) + 1 :].split("/", 1)[0]
        if not entry or entry in MARKERS or (dst_text, entry) in _CLAIMED:
            return
        lease = _LEASES.get(dst_text)
        if lease is not None and lease.lost:
            raise ConversionError(lease.lost)
        objects.write_bytes(f"{_journal_url(dst_text, token)}/{urllib.parse.quote(entry, safe='')}", b"")
        _CLAIMED.add((dst_text, entry))
        return


def _remove_journaled(dst_text: str, token: str) -> None:
    """Remove the entries journaled under `token`, then their journal; crash-safe (the journal goes last)."""
    journal = _journal_url(dst_text, token)
    for quoted in objects.list_names(journal):
        name = urllib.parse.unquote(quoted)
        if not name or name in (".", "..") or "/" in name or name in MARKERS:
            continue  # never a name maxckpt journals
        target = f"{dst_text}/{name}"
        objects.delete_files([target, *objects.find_files(target)])
    objects.delete_files(objects.find_files(journal))


def _clean_debris(dst_text: str, record: dict) -> None:
    """Remove what the dead writer of `record` journaled, then its record."""
    _remove_journaled(dst_text, record["token"])
    objects.delete_files([_record_url(dst_text)])


def _check_existing_record(dst_text: str) -> None:
    """Refuse a DST with a live writer or a record maxckpt cannot vouch for; clean a dead writer's debris."""
    state, record = _read_record(dst_text)
    if state == "absent" or objects.exists(f"{dst_text}/{COMPLETE}"):
        return  # no writer, or one that committed (and died before it removed its record)
    if state == "foreign":
        raise ConversionError(
            f"{dst_text} holds a {WRITING} object that this maxckpt did not write for this destination (another "
            "tool's, an older maxckpt's, damaged, or copied from elsewhere), so it cannot tell whether a "
            "conversion is writing there or what it wrote. Nothing was changed: choose another destination, "
            f"or remove {dst_text}/{WRITING} yourself once you are sure no conversion writes there"
        )
    alive, who = _writer_alive(record)
    if alive:
        raise ConversionError(
            f"{dst_text} is being written by another conversion ({who}); wait until it ends, or choose another "
            "destination. Nothing was changed (--overwrite never replaces an output that is still being written)"
        )
    _clean_debris(dst_text, record)


def _check_object_at(dst_text: str, overwrite: bool) -> None:
    """A folder output never takes the name of an existing object: refused as a local file DST is."""
    if not objects.is_file(dst_text):
        return
    if not overwrite:
        raise ConversionError(
            f"{dst_text} already exists as an object (a file); choose another destination or pass --overwrite"
        )
    # --overwrite: the conversion checked it is a checkpoint (staging.check_destination); it goes before the folder.
    objects.delete_files([dst_text])


def begin(dst: str | os.PathLike, overwrite: bool = False) -> str:
    """Make `dst` (a bucket URL) ready for a conversion's output; returns its normalised URL.

    Applies the rules of the module docstring (a live writer is refused, a
    dead one's journaled debris removed, an existing output replaced only with
    `overwrite`), then writes this conversion's ``writing`` record and starts
    renewing its lease, so from here on a crash leaves recognisable partial output.
    """
    dst_text = os.fspath(as_path(dst))
    objects.require_bucket(dst_text)
    if _is_single_file(dst_text):
        if objects.exists(dst_text) and not overwrite:
            raise ConversionError(f"{dst_text} already exists; choose another destination or pass --overwrite")
        return dst_text  # one object is replaced whole by the upload
    _check_object_at(dst_text, overwrite)
    _check_existing_record(dst_text)
    if objects.list_names(dst_text):
        if not overwrite:
            raise ConversionError(f"{dst_text} already exists; choose another destination or pass --overwrite")
        _remove(dst_text)  # a bucket cannot swap folders: the old output goes before the new one is written
    record = _new_record(dst_text)
    _write_record(record)
    time.sleep(SETTLE_S)
    state, found = _read_record(dst_text)
    if state != "ours" or found["token"] != record["token"]:
        who = f" ({_writer_alive(found)[1]})" if state == "ours" else ""
        raise ConversionError(
            f"{dst_text}: another conversion began writing this destination at the same moment{who}; this one "
            "stopped before writing anything. Wait until it ends, or choose another destination"
        )
    _TOKENS[dst_text] = record["token"]
    _LEASES[dst_text] = _Lease(record)
    return dst_text


def _forget(dst_text: str) -> _Lease | None:
    lease = _LEASES.pop(dst_text, None)
    if lease is not None:
        lease.stop()  # before the record is touched: a renewal must never rewrite a removed record
    _TOKENS.pop(dst_text, None)
    for key in [k for k in _CLAIMED if k[0] == dst_text]:
        _CLAIMED.discard(key)
    return lease


def commit(dst: str | os.PathLike) -> None:
    """Mark the finished output `dst` complete: the ``complete`` marker, then the journal and the ``writing`` record go.

    Refuses (ConversionError, nothing removed) when another writer replaced
    this conversion's record meanwhile: the output is then not this one's to commit.
    """
    dst_text = os.fspath(as_path(dst))
    if _is_single_file(dst_text):
        return
    token = _TOKENS.get(dst_text)
    lease = _forget(dst_text)
    if lease is not None and lease.lost:
        raise ConversionError(lease.lost)
    state, record = _read_record(dst_text)
    if token is not None and (state != "ours" or record["token"] != token):
        raise ConversionError(
            f"{dst_text}: another conversion replaced this one's writing record while it wrote; this output "
            "was not committed and nothing was removed"
        )
    objects.write_bytes(f"{dst_text}/{COMPLETE}", json.dumps({"completed": time.time()}).encode())
    if token is not None:
        objects.delete_files(objects.find_files(_journal_url(dst_text, token)))
    objects.delete_files([_record_url(dst_text)])


def abandon(dst: str | os.PathLike, *, native: bool = False) -> None:
    """Remove what a failed conversion wrote to `dst` (its journaled entries, then its record), when the
    record is still this conversion's; best effort (a crash leaves the record for the next conversion)."""
    dst_text = os.fspath(as_path(dst))
    with contextlib.suppress(Exception):  # the conversion's own error is what the user must see
        if _is_single_file(dst_text):
            if native:
                objects.delete_files([dst_text])
            return
        token = _TOKENS.get(dst_text)
        lease = _forget(dst_text)
        state, record = _read_record(dst_text)
        if token is None or (lease is not None and lease.lost) or state != "ours" or record["token"] != token:
            return  # not this conversion's output any more: nothing of it is removed
        _clean_debris(dst_text, record)


def writing_token(dst: str | os.PathLike) -> str | None:
    """The token of `dst`'s `writing` record now, or None (a scale-out peer keeps it to clean up after process 0)."""
    state, record = _read_record(os.fspath(as_path(dst)))
    return record["token"] if state == "ours" and record is not None else None


def abandon_dead_writer(dst: str | os.PathLike, token: str) -> bool:
    """Remove the uncommitted output the dead writer of `token` left on `dst` (what it journaled, then its record).

    For a scale-out peer that knows process 0, which wrote the record, is dead
    (the coordination service says so); nothing is removed when `dst` was
    committed or its record is another conversion's. True when it removed it.
    """
    dst_text = os.fspath(as_path(dst))
    state, record = _read_record(dst_text)
    if state != "ours" or record is None or record["token"] != token or objects.exists(f"{dst_text}/{COMPLETE}"):
        return False
    _clean_debris(dst_text, record)
    return True


@contextlib.contextmanager
def spooled(dst: str | os.PathLike, *, native: bool = False) -> Iterator[epath.Path]:
    """Yield where a writer writes its part of `dst` (a bucket URL); upload what is left in the spool on success.

    `native=True`: the writer writes to the bucket itself (yields `dst`; it
    journals its entries with :func:`claim`). Otherwise a local spool path
    that does not exist yet: files the writer streams (:func:`open_output`)
    or finishes (:func:`file_done`) go up at once, the rest when the block
    ends. Markers are not this function's job (:func:`begin`,
    :func:`commit`), so each process of a multi-process conversion spools
    its own share into the same `dst`, journaling under the token of the
    record process 0 wrote.
    """
    dst_text = os.fspath(as_path(dst))
    joined = dst_text not in _TOKENS
    if joined:
        state, record = _read_record(dst_text)
        if state != "ours":
            raise ConversionError(f"{dst_text}: no writing record of this conversion; process 0 did not prepare it")
        _TOKENS[dst_text] = record["token"]
    try:
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
    finally:
        if joined:
            _forget(dst_text)


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
        claim(url)
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
