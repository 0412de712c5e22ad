"""Where a checkpoint lives: a local path, a ``gs://`` URL or an ``s3://`` URL; the one rule for telling them apart.

Every command and API takes all three, so paths go through here once:
:func:`is_url` is the one test of "a store URL, not a local path";
:func:`normalize` is the one normalisation at the boundary (local paths made
absolute with ``~`` expanded and ``..`` resolved, since TensorStore refuses
``..`` and Orbax relative paths; URLs returned unchanged, since rewriting them
would break them); :func:`as_path` gives an :class:`etils.epath.Path`
(pathlib locally, fsspec's gcsfs/s3fs for buckets) that keeps the
``scheme://`` intact through ``/``, ``.parent`` and ``os.fspath``; and
:func:`split_url` gives scheme, bucket and key for the TensorStore kvstore
spec and the object stores, refusing a scheme maxckpt cannot serve. Symlinks
are left as they are (resolving them would change what a user sees in
messages); code that compares locations uses :func:`same_or_inside`.

>>> split_url("gs://bucket/run/checkpoints")
Location(scheme='gs', bucket='bucket', key='run/checkpoints')
>>> is_url("/tmp/run"), is_url("s3://b/x")
(False, True)
>>> str(normalize("/a/b/../c")), normalize("gs://bucket/run/../x")
('/a/c', 'gs://bucket/run/../x')
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
from typing import NamedTuple

from etils import epath

from maxckpt.errors import MaxckptError

SCHEMES = ("gs", "s3")
_URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")

# gcsfs logs "Could not determine bucket type" on every call against an emulator or a bucket
# without the metadata permission; it is harmless and would bury real messages.
logging.getLogger("gcsfs").setLevel(logging.ERROR)
logging.getLogger("gcsfs.core").setLevel(logging.ERROR)


def _no_listing_cache() -> None:
    """Checkpoint folders change under us (other hosts, a previous run, Orbax's threads): never trust a cached listing.

    fsspec applies its config to every gcsfs/s3fs instance, including the ones
    epath (and so Orbax) creates.
    """
    try:
        import fsspec.config
    except ImportError:
        return
    for protocol in ("gcs", "gs", "s3", "s3a"):
        fsspec.config.conf.setdefault(protocol, {}).setdefault("use_listings_cache", False)


_no_listing_cache()


class Location(NamedTuple):
    """A URL taken apart: ``scheme`` ("gs", "s3", or "" for a local path), ``bucket``, ``key``."""

    scheme: str
    bucket: str
    key: str


def is_url(path: str | os.PathLike) -> bool:
    """True for a ``scheme://...`` path: an object store, never a local file (:func:`split_url` refuses schemes
    other than ``gs`` and ``s3`` with a message naming them)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    return bool(_URL_RE.match(os.fsdecode(text) if isinstance(text, bytes) else text))


def split_url(path: str | os.PathLike) -> Location:
    """(scheme, bucket, key) of a URL; ("", "", path) for a local path.

    A scheme other than gs/s3 is refused with a message naming the ones supported.
    """
    text = os.fspath(path)
    m = _URL_RE.match(text)
    if not m:
        return Location("", "", text)
    scheme = m.group("scheme").lower()
    if scheme not in SCHEMES:
        raise MaxckptError(
            f"{text}: unsupported storage scheme {scheme}://; maxckpt reads and writes local paths, "
            "gs://bucket/path (Google Cloud Storage) and s3://bucket/path (S3 and S3-compatible stores)"
        )
    bucket, _, key = m.group("rest").partition("/")
    if not bucket:
        raise MaxckptError(f"{text}: no bucket name; expected {scheme}://BUCKET/PATH")
    _check_bucket(scheme, bucket, text)
    return Location(scheme, bucket, key.strip("/"))


_GCS_BUCKET_RE = re.compile(r"^[a-z0-9]([a-z0-9_.-]*[a-z0-9])?$")
_S3_BUCKET_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")  # TensorStore also takes legacy names


def _check_bucket(scheme: str, bucket: str, text: str) -> None:
    """Refuse a bucket name the stores (and TensorStore) reject, before any request: one error that says why.

    Names shorter than 3 characters pass here (no real bucket is; the store says so).
    """
    problem = None
    if scheme == "gs":
        parts = bucket.split(".")
        if not _GCS_BUCKET_RE.match(bucket):
            problem = "use lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        elif ".." in bucket:
            problem = "it must not contain '..'"
        elif len(bucket) > 222 or (len(parts) == 1 and len(bucket) > 63) or any(len(p) > 63 for p in parts):
            problem = "at most 63 characters (222 with dots, at most 63 between two)"
    else:
        if not _S3_BUCKET_RE.match(bucket):
            problem = "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
        elif ".." in bucket:
            problem = "it must not contain '..'"
        elif len(bucket) > 255:
            problem = "at most 63 characters (255 for legacy us-east-1 names)"
        elif re.match(r"^\d+\.\d+\.\d+\.\d+$", bucket):
            problem = "it must not look like an IP address"
    if problem:
        raise MaxckptError(f"{text}: {bucket!r} is not a valid {scheme}:// bucket name: {problem}")


def as_path(path: str | os.PathLike) -> epath.Path:
    """A path object for a local path (an absolute :class:`pathlib.Path`) or a URL (an
    :class:`etils.epath.Path` that keeps its ``scheme://``). Both offer the pathlib API."""
    if isinstance(path, epath.Path) and not isinstance(path, pathlib.PurePath):
        return path
    text = os.fspath(path)
    if is_url(text):  # gs:// and s3://; any other scheme is refused by split_url
        loc = split_url(text)
        from maxckpt.storage.retry import configure_fsspec

        configure_fsspec(loc.scheme)  # bounded timeouts and retries before epath makes (and keeps) its filesystem
        return epath.Path(f"{loc.scheme}://{loc.bucket}/{loc.key}".rstrip("/"))
    # Local paths are made absolute with `~` expanded and `..` resolved (TensorStore refuses `..`
    # in a file path, Orbax refuses relative paths), once, here, so no layer below sees one.
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    check_name_lengths(text)
    return pathlib.Path(os.path.abspath(os.path.expanduser(text)))


NAME_MAX = 255  # bytes in one file or folder name on Linux file systems (ext4, xfs, btrfs, tmpfs)
PATH_MAX = 4096  # bytes in a whole path, its terminating NUL included


def check_name_lengths(text: str) -> None:
    """Refuse a local path the kernel would refuse with ENAMETOOLONG, before any stat() turns it into a traceback.

    Why here: every local path a user hands maxckpt passes through :func:`as_path`.
    """
    raw = os.fsencode(text)
    if len(raw) >= PATH_MAX:
        raise MaxckptError(
            f"{text[:200]}...: the path is {len(raw):,} bytes long, longer than the {PATH_MAX - 1:,} a path may have "
            "(the path is too long); use a shorter path"
        )
    for name in raw.split(b"/"):
        if len(name) > NAME_MAX:
            shown = os.fsdecode(name)
            shown = shown if len(shown) <= 40 else shown[:40] + "..."
            raise MaxckptError(
                f"{text}: the name {shown!r} is {len(name)} bytes long, longer than the {NAME_MAX} bytes a file or "
                "folder name may have (the name is too long); use a shorter name"
            )


def to_str(path: str | os.PathLike) -> str:
    """The text of a path or URL, as users wrote it (``gs://b/x``, never ``gs:/b/x``)."""
    return os.fspath(path)


def join(base: str | os.PathLike, *parts: str) -> epath.Path:
    """`base` / parts, for local paths and URLs alike."""
    out = as_path(base)
    for part in parts:
        out = out / part
    return out


def normalize(path: str | os.PathLike) -> pathlib.Path:
    """An absolute local Path with `~` expanded and `..` resolved; a URL comes back unchanged, as text.

    >>> normalize("x").is_absolute()
    True
    """
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    if is_url(raw):
        return raw  # type: ignore[return-value]  # left alone on purpose (see the module docstring)
    return as_path(raw)  # type: ignore[return-value]  # a local path: a pathlib.Path


def normalize_optional(path: str | os.PathLike | None) -> pathlib.Path | None:
    """:func:`normalize`, passing None through."""
    return None if path is None else normalize(path)


def forms(path: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """The spelled (absolute) and resolved (symlinks followed) forms of local `path`, without duplicates."""
    spelled = pathlib.Path(os.path.abspath(path))
    try:
        real = spelled.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return (spelled,)
    return (spelled,) if real == spelled else (spelled, real)


def same_or_inside(inner: pathlib.Path, outer: pathlib.Path) -> bool:
    """True when local `inner` is `outer` or lies inside it, spelled or resolved."""
    for a in forms(inner):
        for b in forms(outer):
            if a == b or b in a.parents:
                return True
    return False
