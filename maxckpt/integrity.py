"""Checkpoints that prove their bytes: per-tensor content hashes in a manifest.

Why: MaxText writes no checksums, and one flipped byte in an uncompressed chunk decodes to other values without
any error. Every checkpoint maxckpt writes carries :data:`MANIFEST_NAME`, the CRC32C of each logical tensor (its
dtype, shape and C-order bytes, so any reader can check it), hashed as the bytes stream to the writer
(:class:`HashingWriter`). :func:`check_integrity` (`maxckpt verify --integrity`) reads every tensor again and
compares; a conversion checks its source as it reads (:class:`CheckingReader`). See docs/integrity.md for the
manifest's format, where it lies, when hashes are computed and what they cost.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

from maxckpt.errors import CorruptCheckpointError
from maxckpt.storage.urls import is_url

MANIFEST_NAME = "maxckpt-manifest.json"
SIDECAR_SUFFIX = ".maxckpt-manifest.json"
PART_PREFIX = ".maxckpt-manifest-part-"  # one process's share of a multi-process conversion
FORMAT = "maxckpt-manifest"
VERSION = 1
ALGORITHM = "crc32c"
_BLOCK = 64 * 1024**2  # bytes hashed or re-read at once when a check reads a tensor itself


try:
    import google_crc32c as _crc32c

    def _extend(crc: int, data: np.ndarray) -> int:
        return _crc32c.extend(crc, data)

except ImportError:  # pragma: no cover - google-crc32c is a dependency (and gcsfs's)
    _crc32c = None

    def _extend(crc: int, data: np.ndarray) -> int:
        raise RuntimeError("maxckpt's integrity manifests need google-crc32c: pip install google-crc32c")


def _bytes_view(array: np.ndarray) -> np.ndarray:
    """A read-only uint8 view of `array`'s C-order bytes (a copy only when it is not C-contiguous)."""
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    # A read-only array over the same memory (no copy), made without touching any flag of the caller's array or
    # its views: flipping `writeable` on a view of an array another thread is writing out (Orbax) upset that save.
    return np.frombuffer(memoryview(flat).toreadonly(), np.uint8)


def crc32c(array: np.ndarray, crc: int = 0) -> int:
    """CRC32C of `array`'s C-order bytes, continuing from `crc`.

    >>> f"{crc32c(np.frombuffer(b'123456789', np.uint8)):08x}"
    'e3069283'
    """
    view = _bytes_view(array)
    for start in range(0, view.size, _BLOCK):  # blocks: the GIL is let go between them
        crc = _extend(crc, view[start : start + _BLOCK])
    return crc


def _hex(crc: int) -> str:
    return f"{crc:08x}"


def dtype_name(dtype: Any) -> str:
    return np.dtype(dtype).name


Box = tuple[tuple[int, int], ...]


def index_box(shape: tuple[int, ...], index: Any) -> Box:
    """[start, stop) per axis of `tensor[index]` (ints and unit-step slices; None: the whole tensor)."""
    items = tuple(index) if index is not None else ()
    box = []
    for axis, size in enumerate(shape):
        item = items[axis] if axis < len(items) else slice(None)
        if isinstance(item, slice):
            start, stop, step = item.indices(size)
            if step != 1:
                raise ValueError("strided index")
            box.append((start, max(start, stop)))
        else:
            i = int(item)
            i = i + size if i < 0 else i
            box.append((i, i + 1))
    return tuple(box)


def _c_run(shape: tuple[int, ...], box: Box) -> tuple[int, int] | None:
    """(first, last + 1) element offsets when `box` is one contiguous run in C order, else None."""
    axes = len(shape)
    k = 0
    while k < axes and box[k][1] - box[k][0] == 1:
        k += 1
    # axes before k are single indices; axis k any range; every axis after k whole
    if any(box[j] != (0, shape[j]) for j in range(k + 1, axes)):
        return None
    strides = [math.prod(shape[j + 1 :]) for j in range(axes)]
    first = sum(box[j][0] * strides[j] for j in range(axes))
    count = math.prod(hi - lo for lo, hi in box)
    return first, first + count


# ------------------------------------------------------------------ building


@dataclass
class _Pieces:
    dtype: str
    shape: tuple[int, ...]
    pieces: list[tuple[Box, int]] = field(default_factory=list)
    fold: int | None = 0  # the whole-tensor CRC while pieces arrive in C order
    offset: int = 0  # elements folded so far


class Manifest:
    """Per-tensor hashes of one checkpoint (thread-safe); :meth:`to_json` is the file's content."""

    def __init__(self, entries: Mapping[str, dict] | None = None) -> None:
        self.entries: dict[str, dict] = dict(entries or {})
        self._open: dict[str, _Pieces] = {}
        self._ahead: dict[tuple[str, Box], tuple[int, int]] = {}  # (tensor, box) -> (id of the array, its CRC)
        self._lock = threading.Lock()
        # The CRC of an array another part of the conversion already hashed (the source check: see
        # CheckingReader.known_crc), or None; a tensor passed through unchanged is then not hashed again.
        self.known_crc: Any = None

    def _hash(self, array: np.ndarray) -> int:
        known = self.known_crc(array) if self.known_crc is not None else None
        return known if known is not None else crc32c(array)

    def hash_ahead(self, name: str, shape: tuple[int, ...], index: Any, array: np.ndarray) -> None:
        """Hash `tensor[index]` now, on the thread that computed it (a conversion's reader threads), for
        :meth:`add` / :meth:`add_piece` to take when the same array reaches the writer: the writer thread
        then only moves bytes."""
        key = (name, index_box(tuple(shape), index))
        crc = self._hash(array)
        with self._lock:
            self._ahead[key] = (id(array), crc)

    def _crc(self, name: str, box: Box, array: np.ndarray) -> int:
        with self._lock:
            ahead = self._ahead.pop((name, box), None)
        return ahead[1] if ahead is not None and ahead[0] == id(array) else self._hash(array)

    def add(self, name: str, array: np.ndarray) -> None:
        """A whole tensor."""
        crc = self._crc(name, tuple((0, int(d)) for d in array.shape), array)
        entry = {"dtype": dtype_name(array.dtype), "shape": list(array.shape), ALGORITHM: _hex(crc)}
        with self._lock:
            self.entries[name] = entry

    def add_piece(self, name: str, shape: tuple[int, ...], dtype: Any, index: Any, array: np.ndarray) -> None:
        """One piece (`tensor[index]`) of a tensor written piece by piece; :meth:`end` closes it."""
        shape = tuple(int(d) for d in shape)
        box = index_box(shape, index)
        crc = self._crc(name, box, array)
        with self._lock:
            state = self._open.setdefault(name, _Pieces(dtype_name(dtype), shape))
            state.pieces.append((box, crc))
            run = _c_run(shape, box)
            if state.fold is not None and run is not None and run[0] == state.offset:
                state.fold = (
                    _crc32c_concat(state.fold, crc, (run[1] - run[0]) * np.dtype(dtype).itemsize)
                    if state.offset
                    else crc
                )
                state.offset = run[1]
            else:
                state.fold = None

    def end(self, name: str, shape: tuple[int, ...], dtype: Any) -> None:
        with self._lock:
            state = self._open.pop(name, None) or _Pieces(dtype_name(dtype), tuple(int(d) for d in shape))
            entry: dict[str, Any] = {"dtype": state.dtype, "shape": list(state.shape)}
            if state.fold is not None and state.offset == math.prod(state.shape):
                entry[ALGORITHM] = _hex(state.fold if state.pieces else crc32c(np.zeros(0, np.uint8)))
            else:
                entry["pieces"] = [{"index": [list(b) for b in box], ALGORITHM: _hex(crc)} for box, crc in state.pieces]
            self.entries[name] = entry

    def merge(self, other: Mapping[str, dict]) -> None:
        with self._lock:
            self.entries.update(other)

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "algorithm": ALGORITHM,
            "tensors": dict(sorted(self.entries.items())),
        }
        return (json.dumps(doc, indent=1) + "\n").encode()


# CRC32C of a concatenation from the CRCs of its parts (zlib's crc32_combine, for the Castagnoli polynomial).
_POLY = 0x82F63B78


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


@functools.lru_cache(maxsize=256)
def _shift(len2: int) -> tuple[int, ...]:
    """The GF(2) matrix that appends `len2` zero bytes to a CRC32C register (cached: pieces repeat sizes)."""
    result = [1 << n for n in range(32)]  # identity
    power = [_POLY] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):
        power = _gf2_square(power)  # one zero byte
    while len2:
        if len2 & 1:
            result = [_gf2_times(power, v) for v in result]
        len2 >>= 1
        if len2:
            power = _gf2_square(power)
    return tuple(result)


def _crc32c_concat(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C(A + B) from CRC32C(A), CRC32C(B) and len(B) in bytes."""
    if len2 <= 0:
        return crc1
    return _gf2_times(list(_shift(len2)), crc1) ^ crc2


class HashingWriter:
    """Wraps a :class:`~maxckpt.containers.base.TensorWriter`: hashes every tensor and piece on its way in.

    `shapes` (name -> (shape, dtype)) serves `write_piece`, which names no
    shape; :meth:`end_pieces` closes the tensors written that way. Everything
    else (close, abort, `pending_bytes`, `max_pending_bytes`) goes to the
    wrapped writer.
    """

    def __init__(self, writer: Any, manifest: Manifest, shapes: Mapping[str, tuple[Any, Any]] | None = None) -> None:
        object.__setattr__(self, "_writer", writer)
        object.__setattr__(self, "manifest", manifest)
        object.__setattr__(self, "_shapes", dict(shapes or {}))
        object.__setattr__(self, "_pieced", set())

    def write(self, name: str, array: np.ndarray) -> None:
        self.manifest.add(name, array)
        self._writer.write(name, array)

    def write_pieces(self, name: str, shape, dtype, pieces: Iterable[tuple[Any, np.ndarray]]) -> None:
        def hashed() -> Iterator[tuple[Any, np.ndarray]]:
            for index, part in pieces:
                self.manifest.add_piece(name, shape, dtype, index, part)
                yield index, part

        self._writer.write_pieces(name, shape, dtype, hashed())
        self.manifest.end(name, shape, dtype)

    def _write_piece(self, name: str, index: Any, part: np.ndarray) -> None:
        shape, dtype = self._shapes[name]
        self._pieced.add(name)
        self.manifest.add_piece(name, shape, dtype, index, part)
        self._writer.write_piece(name, index, part)

    def end_pieces(self) -> None:
        for name in sorted(self._pieced):
            shape, dtype = self._shapes[name]
            self.manifest.end(name, shape, dtype)
        self._pieced.clear()

    def __getattr__(self, attr: str) -> Any:
        if attr == "write_piece":
            getattr(self._writer, "write_piece")  # AttributeError when the writer has none
            return self._write_piece
        return getattr(self._writer, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self._writer, attr, value)


def output_dir_of(writer: Any) -> Any:
    """The folder a conversion writer's manifest goes in (its step dir, model dir, iteration dir)."""
    for attr in ("step_dir", "directory", "path"):
        value = getattr(writer, attr, None)
        if value is not None:
            return value
    raise AttributeError(f"{type(writer).__name__} names no output folder")


# ----------------------------------------------------------------- the file


def write_file(path: Any, data: bytes) -> None:
    """A small file of the output: through the spool (bucket conversions) or in place; straight to a bucket URL."""
    from maxckpt.storage import objects, outputs

    if is_url(path):
        outputs.claim(path)
        objects.write_bytes(path, data)
    else:
        outputs.write_small(path, data)


def write_sidecar(file: Any, manifest: Manifest) -> None:
    """The manifest of a single-file checkpoint, written atomically beside it (after the file is in place)."""
    from maxckpt.storage import objects

    objects.write_whole(f"{os.fspath(file)}{SIDECAR_SUFFIX}", manifest.to_json())


def part_name(rank: int) -> str:
    return f"{PART_PREFIX}{rank}.json"


def _join(directory: Any, name: str) -> Any:
    return f"{os.fspath(directory)}/{name}" if is_url(directory) else Path(os.fspath(directory)) / name


def write_part(directory: Any, rank: int, manifest: Manifest) -> None:
    """One process's hashes of a multi-process conversion, for process 0 to merge (:func:`merge_parts`)."""
    write_file(_join(directory, part_name(rank)), manifest.to_json())


def merge_parts(directory: Any, expected: Iterable[str], processes: int) -> Manifest:
    """Process 0 of a multi-process conversion: the manifest from every process's part file (removed after).

    The parts are read by name, never by listing (a bucket listing another process's fresh object may be stale).
    """
    from maxckpt.errors import ConversionError
    from maxckpt.storage import objects, outputs

    url = is_url(directory)
    names = [part_name(rank) for rank in range(processes)]
    merged = Manifest()
    for name in names:
        data = objects.read_bytes(_join(directory, name)) if url else outputs.read_small(_join(directory, name))
        merged.merge(json.loads(data).get("tensors", {}))
    missing = [n for n in expected if n not in merged.entries]
    if missing:
        raise ConversionError(f"integrity manifest: no process hashed {len(missing)} tensor(s), e.g. {missing[0]}")
    for name in names:
        if url:
            objects.delete_files([_join(directory, name)])
        else:
            outputs.remove_output(_join(directory, name))
    return merged


def manifest_path(ckpt: Any) -> Any:
    """Where the manifest of an opened checkpoint (:class:`~maxckpt.conversion.checkpoint.Checkpoint`) lies."""
    reader = ckpt.reader
    if ckpt.format.name == "maxtext":
        items = reader.items_dir
        return (items.parent if items.name == "items" else items) / MANIFEST_NAME
    base = getattr(reader, "path", ckpt.path)
    if base.is_file():
        sidecar = base.parent / (base.name + SIDECAR_SUFFIX)
        return (
            sidecar if sidecar.exists() or not (base.parent / MANIFEST_NAME).exists() else base.parent / MANIFEST_NAME
        )
    return base / MANIFEST_NAME


def load_manifest(path: Any) -> dict[str, dict] | None:
    """The per-tensor entries of the manifest at `path`; None when there is none; CorruptCheckpointError when \
unreadable."""
    from maxckpt.storage import objects

    if not objects.exists(path):
        return None
    try:
        doc = json.loads(objects.read_bytes(path))
        if doc.get("format") != FORMAT or doc.get("algorithm") != ALGORITHM or not isinstance(doc.get("tensors"), dict):
            raise ValueError(f"not a {FORMAT} of algorithm {ALGORITHM}")
        if int(doc.get("version", 0)) > VERSION:
            raise ValueError(f"version {doc['version']} is newer than this maxckpt reads ({VERSION})")
        return doc["tensors"]
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as err:
        raise CorruptCheckpointError(
            f"{path}: unreadable integrity manifest ({type(err).__name__}: {str(err)[:200]}); the checkpoint's "
            "hashes cannot be checked: restore the file from a good copy, or remove it to read the checkpoint unchecked"
        ) from None


# ------------------------------------------------------------------ checking


def _mismatch(where: Any, name: str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{where}: tensor {name}: {what} does not match the integrity manifest ({MANIFEST_NAME}); "
        "its bytes changed after maxckpt wrote it (a damaged file or a bad copy)"
    )


def _boxes(entry: dict) -> list[tuple[Box, str]]:
    if ALGORITHM in entry:
        return [(tuple((0, int(d)) for d in entry["shape"]), entry[ALGORITHM])]
    return [(tuple((int(lo), int(hi)) for lo, hi in p["index"]), p[ALGORITHM]) for p in entry.get("pieces", [])]


def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in box)


def hash_read(reader: Any, name: str, box: Box, itemsize: int) -> int:
    """CRC32C of `tensor[box]` read from `reader`, in blocks along the first axis that is not one index."""
    shape = tuple(hi - lo for lo, hi in box)
    k = next((i for i, n in enumerate(shape) if n > 1), None)
    if k is None or math.prod(shape) * itemsize <= _BLOCK:
        return crc32c(reader.read(name, _slices(box)))
    row = math.prod(shape[k + 1 :]) * itemsize
    step = max(1, _BLOCK // max(1, row))
    crc = 0
    lo, hi = box[k]
    for start in range(lo, hi, step):
        part = box[:k] + ((start, min(hi, start + step)),) + box[k + 1 :]
        crc = crc32c(reader.read(name, _slices(part)), crc)
    return crc


def check_entry(reader: Any, info: Any, name: str, entry: dict, where: Any) -> None:
    """Raise CorruptCheckpointError when stored tensor `name` differs from its manifest entry."""
    if dtype_name(info.dtype) != entry.get("dtype") or list(info.shape) != list(entry.get("shape", [])):
        raise _mismatch(
            where,
            name,
            f"dtype/shape {dtype_name(info.dtype)} {list(info.shape)} (manifest: {entry.get('dtype')} "
            f"{entry.get('shape')})",
        )
    for box, want in _boxes(entry):
        got = _hex(hash_read(reader, name, box, np.dtype(info.dtype).itemsize))
        if got != want:
            piece = "" if ALGORITHM in entry else f" piece {[list(b) for b in box]}"
            raise _mismatch(where, name, f"content hash{piece} {got} (manifest: {want})")


class CheckingReader:
    """A source reader that checks what it returns against the source's manifest.

    A read that returns a whole tensor, or boxes of it the manifest hashed
    (a layer the writer wrote as one piece), or that continues the tensor in
    C order, is checked on the spot. :meth:`finish` then reads again only
    what the conversion read but could not check that way; tensors the
    conversion never reads (a MaxText source's optimizer state, when
    exporting parameters) are not checked - they do not reach the output.
    """

    def __init__(self, reader: Any, entries: Mapping[str, dict], where: Any) -> None:
        self._reader = reader
        self._entries = entries
        self._where = where
        self._infos = reader.tensors()
        self._lock = threading.Lock()
        self._todo: dict[str, set[Box]] = {}  # tensor -> boxes not checked yet (of tensors read at all)
        # Whole-hash tensors read as C-order runs, in any order (several workers): start -> (end, crc) of
        # each run not yet joined to the one before it; joined with the CRCs' concatenation, no bytes kept.
        self._runs: dict[str, dict[int, tuple[int, int]]] = {}
        # id -> (weak reference, CRC32C of its bytes) of the read-only arrays read() returned whole and hashed
        self._known: dict[int, tuple[weakref.ref, int]] = {}

    def tensors(self):
        return self._infos

    def close(self) -> None:
        self._reader.close()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._reader, attr)

    def _pending(self, name: str, entry: dict) -> set[Box]:
        todo = self._todo.get(name)
        if todo is None:
            todo = self._todo[name] = {box for box, _ in _boxes(entry)}
        return todo

    def known_crc(self, array: np.ndarray) -> int | None:
        """The CRC32C of `array` when it is an array :meth:`read` returned and hashed whole, else None.

        What the source check computed from the very bytes it returned, so the
        output manifest may take it for a tensor (or piece) passed through
        unchanged: the same object (a weak reference, never an id alone, which a
        later array may reuse), and read-only, so nothing changed it since.
        """
        with self._lock:
            known = self._known.get(id(array))
        return known[1] if known is not None and known[0]() is array else None

    def _remember(self, array: np.ndarray, crc: int) -> np.ndarray:
        """A read-only view of `array` (the caller's flags untouched), remembered with the CRC of its bytes."""
        if not isinstance(array, np.ndarray) or array.ndim == 0 or not array.flags.c_contiguous:
            return array  # a numpy scalar (a 0-d read) has no flags to set; a copy would reach the writer
        view = array.view()
        view.flags.writeable = False
        key = id(view)

        def forget(ref: weakref.ref, key: int = key) -> None:
            with self._lock:
                if self._known.get(key, (None,))[0] is ref:
                    del self._known[key]

        with self._lock:
            self._known[key] = (weakref.ref(view, forget), crc)
        return view

    def read(self, name: str, index: Any = None) -> np.ndarray:
        try:
            array = self._reader.read(name, index)
        except CorruptCheckpointError as err:  # a chunk that no longer decodes: name the tensor, as a mismatch does
            if f"tensor {name}:" in str(err):
                raise
            raise CorruptCheckpointError(f"{self._where}: tensor {name}: unreadable ({first_line(err)})") from None
        entry = self._entries.get(name)
        if entry is None:
            return array
        info = self._infos[name]
        try:
            box = index_box(tuple(info.shape), index)
        except (ValueError, TypeError):
            with self._lock:
                self._pending(name, entry)
            return array
        with self._lock:
            todo = set(self._pending(name, entry))
        if not todo:  # checked already (a tensor read again: fused parts, tied weights)
            return array
        wanted = dict(_boxes(entry))
        checked = []
        own = None  # the CRC of the whole of `array`, when the check computed it
        for piece in todo:
            if all(plo >= lo and phi <= hi for (plo, phi), (lo, hi) in zip(piece, box)):
                sub = (
                    array[tuple(slice(plo - lo, phi - lo) for (plo, phi), (lo, _) in zip(piece, box))]
                    if piece != box
                    else array
                )
                crc = crc32c(sub)
                got = _hex(crc)
                if got != wanted[piece]:
                    raise _mismatch(self._where, name, f"content hash {got} (manifest: {wanted[piece]})")
                checked.append(piece)
                if piece == box:
                    own = crc
        if not checked and ALGORITHM in entry:
            run = _c_run(tuple(info.shape), box)
            whole, own = self._joined(name, run, array, np.dtype(info.dtype).itemsize, math.prod(info.shape))
            if whole is not None:
                if _hex(whole) != entry[ALGORITHM]:
                    raise _mismatch(self._where, name, f"content hash {_hex(whole)} (manifest: {entry[ALGORITHM]})")
                checked = list(todo)
        with self._lock:
            self._todo[name].difference_update(checked)
        return array if own is None else self._remember(array, own)

    def _joined(self, name: str, run: tuple[int, int] | None, array: np.ndarray, itemsize: int,
                total: int) -> tuple[int | None, int | None]:
        """Add the C-order run `run` (elements) of `name` with its values; (the whole tensor's CRC once the
        runs read so far cover it from its first element to its last, else None; the CRC of `array`, when hashed)."""
        if run is None or run[0] == run[1]:
            return None, None
        crc = crc32c(array)  # outside the lock: the expensive part, done by the reading worker
        with self._lock:
            runs = self._runs.setdefault(name, {})
            if run[0] in runs:
                return None, crc  # the same run read again: already counted
            runs[run[0]] = (run[1], crc)
            if 0 not in runs:
                return None, crc
            end, joined = runs[0]
            while end in runs:  # join every run that follows the first, in order
                nxt_end, nxt_crc = runs.pop(end)
                joined = _crc32c_concat(joined, nxt_crc, (nxt_end - end) * itemsize)
                end = nxt_end
            runs[0] = (end, joined)
            return (joined if end == total else None), crc

    def finish(self) -> int:
        """Check what was read but not yet checked (reading it again); returns the tensors checked here."""
        with self._lock:
            todo = {n: set(b) for n, b in self._todo.items() if b}
        for name in todo:
            check_entry(self._reader, self._infos[name], name, self._entries[name], self._where)
        with self._lock:
            for name in todo:
                self._todo[name].clear()
        return len(todo)


def first_line(err: BaseException) -> str:
    """An error as one short line (its type and first line), for a table row or a wrapped message."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:400]


def watch_source(ckpt: Any) -> CheckingReader | None:
    """Make an opened checkpoint check its reads against its manifest; None when it has none."""
    path = manifest_path(ckpt)
    entries = load_manifest(path)
    if entries is None:
        return None
    checker = CheckingReader(ckpt.reader, entries, ckpt.path)
    if getattr(ckpt, "_model_reader", None) is ckpt.reader:  # the reader the model's tensors are read through
        ckpt._model_reader = checker
    ckpt.reader = checker
    return checker
