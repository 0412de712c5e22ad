"""Where a conversion writes: checks on the destination, a temporary folder that says who owns it, the final rename.

Rules (docs/conversion.md, "Safety"):

- The output is written inside `<dst>.tmp-XXXXXXXX/` beside `dst` and renamed
  to `dst` only once complete; on any failure, Ctrl-C included, that folder is
  removed and `dst` is untouched.
- The folder records its owner (host, pid, process start time, boot id) in
  `maxckpt-owner.json`. A process killed outright cannot clean up, so the next
  conversion to the same `dst` removes temporary folders whose owner is gone
  (and says so), and leaves those of a live conversion alone.
- That record is written in a hidden `.<dst>.prep-<host>-<pid>-<start>-*`
  folder first, renamed to `<dst>.tmp-*` once complete. A process killed in
  between leaves the hidden folder; its name says who made it even when the
  record is missing, so the next conversion removes it once that process is
  gone (see :func:`clean_stale`).
- An existing `dst` is replaced only with `overwrite=True`, only when it is an
  empty folder or a checkpoint of a format maxckpt recognises, and never when
  it is, holds or is held by the source, the current directory or one of its
  parents, or a folder holding a version-control directory. A destination
  inside the source is refused even without `overwrite` (it would change the
  checkpoint being read).

>>> check_destination("/runs/a/checkpoints", "/runs/a/checkpoints/5", overwrite=True)  \
# doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
ConversionError: /runs/a/checkpoints/5 is inside the source /runs/a/checkpoints ...
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

from maxckpt.errors import CheckpointNotFoundError, ConversionError, MaxckptError
from maxckpt.storage import outputs
from maxckpt.storage.ownership import host_tag as _host_tag
from maxckpt.storage.ownership import owner_alive, owner_record
from maxckpt.storage.ownership import proc_start as _proc_start
from maxckpt.storage.urls import as_path, forms, is_url, normalize, same_or_inside

OWNER_FILE = "maxckpt-owner.json"
# seconds: a `.prep` folder lives for an instant, so one a day old is abandoned, whoever made it
PREP_MAX_AGE = 24 * 3600
_TMP_SUFFIX = re.compile(r"[a-z0-9_]{8}")  # what tempfile.mkdtemp appends, and so what `_owned_folder` keeps
# After `.<dst>.prep-`: `<host tag>-<pid>-<process start>-` (none before this naming), then mkdtemp's 8 random
# characters.
_PREP_NAME = re.compile(r"(?:(?P<tag>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})-(?P<start>[0-9]{1,20})-)?(?P<rand>[a-z0-9_]{8})")
REPLACED = "replaced-destination"  # the old dst, parked here between the two renames of a replacement
VCS_DIRS = (".git", ".hg", ".svn", ".bzr", "_darcs", "CVS", ".jj", ".pijul", ".fslckout", "_FOSSIL_")
_WRITE_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EFBIG,
    errno.EIO,
    errno.EBUSY,
    errno.EXDEV,
    errno.ENAMETOOLONG,
    errno.EMFILE,
}


# ------------------------------------------------------------ the destination


def check_destination(src: str | os.PathLike, dst: str | os.PathLike, overwrite: bool) -> None:
    """Refuse a destination whose replacement could lose data (see the module docstring). Changes nothing."""
    if is_url(src) or is_url(dst):
        _check_url_destination(src, dst, overwrite)
        return
    src, dst = normalize(src), normalize(dst)
    if same_or_inside(src, dst):
        raise ConversionError(
            f"{dst} is or holds the source {src}; "
            + ("--overwrite would delete it once the conversion succeeds. " if overwrite else "")
            + "Choose a destination outside the source."
        )
    if same_or_inside(dst, src):
        raise ConversionError(
            f"{dst} is inside the source {src}; writing there would change the checkpoint being read"
            + (" (and --overwrite could replace part of it)" if overwrite else "")
            + ". Choose a destination outside the source."
        )
    if not _exists(dst):
        return
    if not overwrite and not (dst.is_dir() and not dst.is_symlink() and not any(dst.iterdir())):
        raise ConversionError(f"{dst} already exists; choose another destination or pass --overwrite")
    # An existing DST (even an empty folder, which is filled as if it did not exist) is renamed away at the end.
    if same_or_inside(Path.cwd(), dst):
        raise ConversionError(
            f"{dst} is the current directory or one of its parents; a conversion never replaces it. "
            "Choose a new destination folder."
        )
    if _is_mount_point(dst):
        raise ConversionError(f"{dst} is a mount point, which cannot be replaced; write to a new folder inside it.")
    if overwrite:
        _check_replaceable(dst)


def _url_same_or_inside(inner: str | os.PathLike, outer: str | os.PathLike) -> bool:
    """`inner` is `outer` or lies below it, for two bucket URLs (a local path and a URL never overlap)."""
    if not (is_url(inner) and is_url(outer)):
        return False
    a, b = os.fspath(as_path(inner)).rstrip("/"), os.fspath(as_path(outer)).rstrip("/")
    return a == b or a.startswith(b + "/")


def _check_url_destination(src: str | os.PathLike, dst: str | os.PathLike, overwrite: bool) -> None:
    """The same rules on a bucket: never the source or near it, and --overwrite only replaces a checkpoint.

    A bucket has no current directory or mount points; a partly written output
    (a writing record without a completion marker) is debris that
    :func:`maxckpt.storage.outputs.bucket_output` cleans by itself.
    """
    if _url_same_or_inside(src, dst):
        raise ConversionError(f"{dst} is or holds the source {src}; choose a destination outside the source.")
    if _url_same_or_inside(dst, src):
        raise ConversionError(f"{dst} is inside the source {src}; choose a destination outside the source.")
    if not is_url(dst) or not overwrite:
        return
    target = as_path(dst)
    if target.exists() and not outputs.is_partial_output(dst):
        _check_replaceable(target)


def _is_mount_point(path: Path) -> bool:
    """A mount point cannot be renamed away; bind mounts on the same device are only in the mount table."""
    if os.path.ismount(path):
        return True
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            table = f.read().decode("utf-8", "replace")
    except OSError:
        return False
    targets = {str(p) for p in forms(path)}
    for line in table.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point in targets:
                return True
    return False


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _check_replaceable(dst: Path) -> None:
    """With --overwrite: `dst` may go only if it is an empty folder or a recognised checkpoint, and no VCS checkout.

    The same for a local folder and a bucket prefix (where "empty" never
    arises: a prefix without objects does not exist).
    """
    if dst.is_dir():
        vcs = [name for name in VCS_DIRS if (_exists(dst / name) if not is_url(dst) else (dst / name).exists())]
        if vcs:
            raise ConversionError(
                f"{dst} holds a version-control directory ({vcs[0]}); --overwrite never replaces it. "
                "Choose a new destination folder."
            )
        if not any(dst.iterdir()):
            return
    from maxckpt.formats import detect_format

    try:
        detect_format(dst)
    except MaxckptError as err:
        damaged = "" if isinstance(err, CheckpointNotFoundError) else f" (it looks damaged: {err})"
        raise ConversionError(
            f"{dst} exists and is neither an empty folder nor a checkpoint maxckpt recognises{damaged}; "
            "--overwrite only replaces those. Choose a new destination."
        ) from None


# ------------------------------------------------------------------ ownership


def _temporaries(dst: Path) -> list[Path]:
    """The `<dst>.tmp-*` folders of exactly this `dst`: the suffix is the 8 characters `mkdtemp` draws.

    A prefix match alone would take `out.tmp-x.tmp-abcd1234`, the temporary
    of DST `out.tmp-x`, for one of DST `out`, and restore a destination it had
    parked to the wrong name.
    """
    prefix = f"{dst.name}.tmp-"
    try:
        return sorted(
            p
            for p in dst.parent.iterdir()
            if p.name.startswith(prefix) and _TMP_SUFFIX.fullmatch(p.name[len(prefix) :])
        )
    except OSError:
        return []


def clean_stale(dst: str | os.PathLike) -> list[str]:
    """Remove `dst.tmp-*` folders whose owner process is gone; returns a note for each one seen.

    A folder still being written by a live process, one owned by another
    host, or one without an owner record (older maxckpt, another tool) is
    left alone and mentioned. Hidden `.dst.prep-*` folders of conversions
    killed before their rename go too (:func:`_clean_stale_preps`).
    """
    dst = normalize(dst)
    notes: list[str] = []
    for tmp in _temporaries(dst):
        owner = None
        if tmp.is_dir() and not tmp.is_symlink():
            try:
                from maxckpt.storage.bounded import read_json_object

                owner = read_json_object(tmp / OWNER_FILE, max_bytes=64 * 1024)
            except (OSError, ValueError):
                owner = None
        if owner is None:
            notes.append(
                f"left {tmp} alone: a temporary folder with no owner record (an older maxckpt or another tool); "
                "remove it yourself if no conversion is writing it"
            )
            continue
        who = f"pid {owner.get('pid')} on {owner.get('host')}"
        alive = owner_alive(owner)
        if alive is None:
            notes.append(
                f"left {tmp} alone: written by {who}, another host; remove it yourself once that conversion is over"
            )
            continue
        if alive:
            notes.append(f"left {tmp} alone: a conversion ({who}) is still writing it")
            continue
        if remove_abandoned(tmp, dst):
            notes.append(f"restored {dst} from {tmp}, where a conversion ({who}) that is gone had parked it")
        if _exists(tmp):
            notes.append(
                f"could not remove the stale temporary folder {tmp} ({who}, no longer running); remove it yourself"
            )
        else:
            notes.append(
                f"removed the stale temporary folder {tmp} left by a conversion ({who}) that is no longer running"
            )
    return notes + _clean_stale_preps(dst)


def remove_abandoned(tmp: Path, dst: Path) -> bool:
    """Remove the `dst.tmp-*` folder `tmp` of a conversion known to be gone; True when it restored `dst` from it.

    Its caller knows the owner is dead: :func:`clean_stale` from the owner
    record, a scale-out peer from the coordination service (process 0 stopped
    heartbeating). A `dst` the dead process had parked in `tmp` between the
    two renames of a replacement goes back first, so nothing the user had is lost.
    """
    tmp, dst = Path(tmp), Path(dst)
    prefix = f"{dst.name}.tmp-"
    if tmp.parent != dst.parent or not tmp.name.startswith(prefix) or not _TMP_SUFFIX.fullmatch(tmp.name[len(prefix):]):
        raise ValueError(f"{tmp} is not a temporary folder of {dst}")  # never remove anything else
    parked, restored = tmp / REPLACED, False
    if _exists(parked) and not _exists(dst):
        os.rename(parked, dst)  # the process died between the two renames of a replacement
        restored = True
    _remove_tree(tmp)
    return restored


def _preps(dst: Path) -> list[tuple[Path, re.Match]]:
    """The `.<dst>.prep-*` folders of exactly this `dst`: real folders whose name is one :func:`_owned_folder` makes."""
    prefix = f".{dst.name}.prep-"
    try:
        entries = sorted(p for p in dst.parent.iterdir() if p.name.startswith(prefix))
    except OSError:
        return []
    found = []
    for path in entries:
        match = _PREP_NAME.fullmatch(path.name[len(prefix) :])  # `.out.prep-x.prep-...` belongs to DST `out.prep-x`
        if match and path.is_dir() and not path.is_symlink():
            found.append((path, match))
    return found


def _clean_stale_preps(dst: Path) -> list[str]:
    """Remove hidden `.<dst>.prep-*` folders of conversions killed before their `<dst>.tmp-*` got its name.

    Such a folder only ever holds the owner record (complete, partial or not
    yet written), and a live conversion holds it for an instant. It goes when
    provably abandoned: its name (this host and boot, pid, process start)
    names a process that is gone; or, for a folder made on another host or
    before a reboot (or by a maxckpt that did not name it so), its complete
    owner record names a process that is gone, or it is older than
    :data:`PREP_MAX_AGE`. The folder of a conversion that is making it right
    now names a live process, so it stays; so does one holding anything but
    the record. Buckets have no `.prep` folders (nothing is renamed there).
    """
    notes: list[str] = []
    for prep, name in _preps(dst):
        try:
            held = {entry.name: entry.is_file(follow_symlinks=False) for entry in os.scandir(prep)}
            age = time.time() - max([prep.stat().st_mtime] + [(prep / n).lstat().st_mtime for n in held])
        except OSError:
            continue  # gone meanwhile (renamed by its owner, or removed by another conversion), or unreadable
        if any(n != OWNER_FILE or not is_file for n, is_file in held.items()):
            notes.append(
                f"left {prep} alone: it holds files a conversion never puts there; remove it yourself if "
                "it is not yours"
            )
            continue
        owner = None
        if held:
            try:
                from maxckpt.storage.bounded import read_json_object

                owner = read_json_object(prep / OWNER_FILE, max_bytes=64 * 1024)
            except (OSError, ValueError):
                owner = None  # killed while writing it
        if name["tag"] == _host_tag():
            pid, start = int(name["pid"]), int(name["start"]) or None
            gone = not owner_alive({"host": socket.gethostname(), "pid": pid, "process_start": start})
            who = f"pid {pid} on this host"
        elif owner is not None and owner_alive(owner) is not None:
            gone = not owner_alive(owner)
            who = f"pid {owner.get('pid')} on {owner.get('host')}"
        else:
            gone = age > PREP_MAX_AGE
            who = f"pid {owner.get('pid')} on {owner.get('host')}" if owner else "a process this host cannot identify"
            if not gone:
                notes.append(
                    f"left {prep} alone: a conversion's hidden folder made by {who} (another host, an earlier boot "
                    f"or an older maxckpt); it is removed once it is {PREP_MAX_AGE // 3600} hours old"
                )
                continue
        if not gone:
            continue  # a conversion is creating its temporary folder right now: renamed in an instant
        _remove_tree(prep)
        if _exists(prep):
            notes.append(
                f"could not remove the stale hidden folder {prep} ({who}, no longer running); remove it yourself"
            )
        else:
            notes.append(
                f"removed the stale hidden folder {prep} left by a conversion ({who}) killed before it started writing"
            )
    return notes


# -------------------------------------------------------------------- staging


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ignore Ctrl-C (and SIGTERM, which the CLI turns into Ctrl-C) while cleaning up.

    A second press, or a scheduler's repeated SIGTERM, must not leave half a removal behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, signal.SIG_IGN)
    except (ValueError, OSError):
        pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _remove_tree(path: Path, *, settle: bool = False) -> None:
    """Remove `path`, retrying for up to 2 s while a writer thread may still be closing or writing files.

    `settle` (after a failed conversion): look once more a moment later, since a
    background write (TensorStore) finishing just then re-creates the folder.
    """
    with _sigint_deferred():
        deadline, delay = time.monotonic() + 2.0, 0.02
        while True:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif _exists(path):
                with contextlib.suppress(OSError):
                    path.unlink()
            if not _exists(path):
                if not settle:
                    return
                time.sleep(0.1)
                if not _exists(path):
                    return
            if time.monotonic() > deadline:
                return
            time.sleep(delay)
            delay = min(2 * delay, 0.2)


def write_failure(err: BaseException, dst: Path) -> ConversionError | None:
    """A ConversionError for an OS-level write failure (disk full, read-only, no permission), else None.

    torch and TensorStore report these as RuntimeError/ValueError with the
    OS message in the text; a full disk is also recognised by free space.
    """
    text = str(err)
    reason = None
    cause = _os_error_in_chain(err)
    if cause is not None:
        reason = os.strerror(cause.errno)
    else:
        lowered = text.lower()
        for needle, what in (
            ("no space left", os.strerror(errno.ENOSPC)),
            ("disk quota", os.strerror(errno.EDQUOT)),
            ("read-only file system", os.strerror(errno.EROFS)),
            ("permission denied", os.strerror(errno.EACCES)),
            ("file write failed", None),
            ("failed writing", None),
            ("resource_exhausted", None),
        ):
            if needle in lowered:
                reason = what or _disk_state(dst) or "the write failed"
                break
        if reason is None and isinstance(err, (RuntimeError, ValueError)) and _disk_state(dst):
            reason = _disk_state(dst)
    if reason is None:
        return None
    return ConversionError(
        f"cannot write {dst}: {reason}. Nothing was changed: the partial output was removed"
        + (
            " (free some space or choose another destination)"
            if reason in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
            else ""
        )
    )


def _os_error_in_chain(err: BaseException) -> OSError | None:
    """The first OSError with a write-failure errno in `err`'s cause/context chain."""
    seen = 0
    current: BaseException | None = err
    while current is not None and seen < 20:
        if isinstance(current, OSError) and current.errno in _WRITE_ERRNOS:
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _disk_state(dst: Path) -> str | None:
    try:
        st = os.statvfs(dst.parent)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize < 1024 * 1024:
        return os.strerror(errno.ENOSPC)
    return None


@contextlib.contextmanager
def staged_output(
    dst: str | os.PathLike, overwrite: bool = False, notes: list[str] | None = None, *, native: bool = False
) -> Iterator[Path]:
    """Yield a path to write the output at; it becomes `dst` only if the block succeeds.

    The path lies inside a fresh `<dst>.tmp-*` folder (with its owner record);
    the folder is removed whatever happens, and stale ones of dead
    conversions are cleaned first (their notes go to `notes`). On a bucket,
    where nothing can be renamed, :func:`maxckpt.storage.outputs.bucket_output`
    commits with markers instead (`native`: the writer writes to the bucket itself).
    """
    if is_url(dst):
        with outputs.bucket_output(dst, overwrite, native=native) as out:
            yield out
        return
    dst = normalize(dst)
    stale = clean_stale(dst)
    if notes is not None:
        notes.extend(stale)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        work = _owned_folder(dst)
    except OSError as err:
        raise ConversionError(
            f"cannot create the output beside {dst}: {err.strerror or err}. Nothing was written"
        ) from None
    try:
        out = work / dst.name
        yield out
        if not _exists(out):
            raise ConversionError(f"the writer produced nothing at {out}")
        _commit(out, dst, work, overwrite)
    except BaseException as err:
        plain = isinstance(err, (MaxckptError, KeyboardInterrupt, SystemExit, GeneratorExit))
        failure = None if plain else write_failure(err, dst)  # before removal: a full disk is still full
        _remove_tree(work, settle=True)
        if failure is not None:
            raise failure from None
        raise
    _remove_tree(work)


def _owned_folder(dst: Path) -> Path:
    """A new `<dst>.tmp-*` folder that holds its complete owner record from the moment it has that name.

    The record is written in a hidden `.<dst>.prep-<host>-<pid>-<start>-*`
    folder, which is then renamed: a process killed at any point leaves either
    no `<dst>.tmp-*` or one whose owner a later conversion can check (and clean
    when it is gone). A process killed before the rename leaves the hidden
    folder, whose name alone (the record may be half written) lets a later
    conversion tell that its maker is gone (:func:`_clean_stale_preps`).
    """
    pid = os.getpid()
    prefix = f".{dst.name}.prep-{_host_tag()}-{pid}-{_proc_start(pid) or 0}-"
    prep = Path(tempfile.mkdtemp(prefix=prefix, dir=dst.parent))
    try:
        with open(prep / OWNER_FILE, "w") as f:
            json.dump(owner_record(), f)
        work = dst.parent / f"{dst.name}.tmp-{prep.name[len(prefix):]}"
        os.rename(prep, work)
    except BaseException as err:
        shutil.rmtree(prep, ignore_errors=True)
        failure = write_failure(err, dst) if isinstance(err, OSError) else None
        if failure is not None:
            raise failure from None
        raise
    return work


def _fsync_path(path: Path) -> None:
    folder = path.is_dir()
    fd = os.open(path, (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if folder else os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP) and not (folder and err.errno in (errno.EBADF, errno.EACCES)):
            raise  # a write error the disk reports now: the conversion fails rather than publish lost data
    finally:
        os.close(fd)


def make_durable(out: Path) -> None:
    """fsync every file and folder of the finished output, so the rename that publishes it publishes data on disk.

    Why: the writers fsync their tensor files, but small files (config.json,
    the index, Orbax's metadata and commit markers) and the folders' entries
    would otherwise reach the disk whenever the kernel gets to them; after a
    power cut the renamed `dst` could then hold empty or missing files. A file
    already synced costs one cheap call here.
    """
    if out.is_file():
        _fsync_path(out)
        return
    for root, dirs, files in os.walk(out, topdown=False):
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                _fsync_path(path)
        _fsync_path(Path(root))


def _commit(out: Path, dst: Path, work: Path, overwrite: bool) -> None:
    """Rename the finished output to `dst`, replacing an existing one (parked in `work` until the new one is in).

    The output is made durable first, and the parent folder after the rename,
    so that a power cut leaves either the old state or the whole new output.
    """
    make_durable(out)
    _publish(out, dst, work, overwrite)
    with contextlib.suppress(OSError):  # the rename itself is durable once its folder is synced
        _fsync_path(dst.parent)


def _publish(out: Path, dst: Path, work: Path, overwrite: bool) -> None:
    if _exists(dst):
        is_empty_dir = dst.is_dir() and not dst.is_symlink() and not any(dst.iterdir())
        if not overwrite and not is_empty_dir:
            raise ConversionError(f"{dst} appeared while converting; choose another destination or pass --overwrite")
        parked = work / REPLACED
        try:
            os.rename(dst, parked)
        except OSError as err:
            raise ConversionError(
                f"cannot replace {dst}: {err.strerror or err}. It is unchanged; the new output was removed"
            ) from None
        try:
            os.rename(out, dst)
        except BaseException:
            os.rename(parked, dst)  # the user's dst goes back where it was
            raise
    else:
        try:
            os.rename(out, dst)
        except OSError as err:
            raise ConversionError(f"cannot create {dst}: {err.strerror or err}. Nothing was written") from None
