"""safetensors: a validating lazy reader and a streaming, sharded writer.

File format: u64 little-endian header length N, N bytes of JSON
`{name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}}`,
then the packed little-endian C-order data. A sharded model is
`model-0000i-of-0000N.safetensors` plus `model.safetensors.index.json`
(`{"metadata": {"total_size": bytes}, "weight_map": {name: file}}`).

The reader validates every header before trusting it (header length, JSON,
dtypes, shapes against byte ranges, ranges inside the file, no overlaps,
index entries that point to real tensors), so a truncated or hostile file
ends in one :class:`CorruptCheckpointError` naming the file and the problem.
It reads one tensor, or a range of leading rows, with plain file reads.

The writer never holds more than one tensor when it knows the tensor list
up front (`plan=`, what the conversion pipeline passes): shard boundaries
and headers are computed first and each tensor is written straight to its
place. Without a plan it buffers at most one shard plus one tensor.

>>> import numpy as np, tempfile
>>> d = tempfile.mkdtemp()
>>> w = SafetensorsWriter(d); w.write("a", np.arange(4, dtype=np.float32)); w.close()
>>> SafetensorsReader(d).read("a", (slice(1, 3),)).tolist()
[1.0, 2.0]
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np

from maxckpt import libc
from maxckpt.storage.bounded import loads_json, read_json_object
from maxckpt.containers.direct_io import DirectWrites, pwrite_all
from maxckpt.errors import ConversionError, CorruptCheckpointError, TensorNotFoundError
from maxckpt.storage import objects, outputs
from maxckpt.storage.urls import as_path, is_url, normalize
from maxckpt.tensors import Index, TensorInfo, index_shape
from maxckpt.units import parse_size

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # HF's "5GB"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),  # MX block scales (E8M0 exponents), read like uint8 ones
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES: dict[np.dtype, str] = {v: k for k, v in DTYPES.items()}

# ------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int


def read_header(path: Path) -> tuple[dict[str, _Entry], dict[str, str]]:
    """Parse and validate one file's header: (tensor entries, __metadata__)."""
    path = as_path(path)
    try:
        size = objects.size(path)
        with objects.open_read(path, block_size=1 << 20) as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise CorruptCheckpointError(
                    f"{path}: {size} bytes, too short for a safetensors header (truncated file?)"
                )
            (n,) = struct.unpack("<Q", raw_len)
            if n > MAX_HEADER_BYTES or n > size - 8:
                raise CorruptCheckpointError(
                    f"{path}: header claims {n} bytes but the file has {size} and the limit is {MAX_HEADER_BYTES}; "
                    "the file is truncated or not safetensors"
                )
            raw = f.read(n)
    except OSError as err:
        raise CorruptCheckpointError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        header = loads_json(raw)
    except ValueError as err:
        raise CorruptCheckpointError(f"{path}: header is not valid JSON ({err})") from err
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + n
    entries: dict[str, _Entry] = {}
    for name, item in header.items():
        entries[name] = _validate_entry(path, name, item, data_start, size)
    ranges = sorted((e.begin, e.end, name) for name, e in entries.items() if e.end > e.begin)
    for (b0, e0, n0), (b1, e1, n1) in zip(ranges, ranges[1:]):
        if b1 < e0:
            raise CorruptCheckpointError(
                f"{path}: tensors {n0!r} [{b0 - data_start}, {e0 - data_start}) and {n1!r} "
                f"[{b1 - data_start}, {e1 - data_start}) overlap; the header is corrupt or hostile"
            )
    return entries, metadata


def _validate_entry(path: Path, name: str, item, data_start: int, size: int) -> _Entry:
    try:
        dtype_name, shape, (begin, end) = item["dtype"], tuple(item["shape"]), item["data_offsets"]
        if not all(_is_int(v) for v in (*shape, begin, end)):
            raise TypeError("shape and data_offsets must hold integers")
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptCheckpointError(f"{path}: tensor {name!r} has a malformed header entry {item!r}") from err
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise CorruptCheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype_name!r}")
    dtype = DTYPES[dtype_name]
    if any(d < 0 for d in shape):
        raise CorruptCheckpointError(f"{path}: tensor {name!r} has a negative dimension in {shape}")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: a hostile shape cannot overflow into a match
    if begin < 0 or end < begin or end - begin != nbytes:
        raise CorruptCheckpointError(
            f"{path}: tensor {name!r} spans bytes [{begin}, {end}) but {dtype_name}{list(shape)} needs {nbytes}"
        )
    if data_start + end > size:
        raise CorruptCheckpointError(
            f"{path}: tensor {name!r} ends at byte {data_start + end} but the file has {size} bytes (truncated file?)"
        )
    return _Entry(path, dtype, shape, data_start + begin, data_start + end)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def safetensors_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The files of a safetensors checkpoint (file, sharded dir, or single-file dir) and its weight map."""
    path = as_path(path)
    if path.is_file():
        return [path], None
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = read_json_object(index)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
            # Shards are file names inside this directory (what HF writes); anything else is damage.
            for name, file in weight_map.items():
                # "" and ".." pass the name test but are the folder and its parent: reading them said "is a directory".
                if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
                    raise ValueError(
                        f"weight_map maps {name!r} to {file!r}, an invalid file name in the index; shards are file "
                        "names in this directory (model-00001-of-00002.safetensors): fix the index or copy the "
                        "model again"
                    )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CorruptCheckpointError(f"{index}: not a valid safetensors index ({err})") from None
        files = sorted({path / f for f in weight_map.values()})
        missing = [f for f in files if not f.exists()]  # a folder or pipe of that name: read_header says what it is
        if missing:
            raise CorruptCheckpointError(f"{index}: lists {missing[0].name}, which does not exist in {path}")
        return files, weight_map
    files = sorted(path.glob("*.safetensors"))
    if not files:
        from maxckpt.errors import CheckpointNotFoundError

        raise CheckpointNotFoundError(f"{path}: no *.safetensors files and no {INDEX_FILE}")
    return files, None


class SafetensorsReader:
    """Lazy reader for a `.safetensors` file or an HF model directory (sharded or not)."""

    def __init__(self, path: str | os.PathLike):
        self.path = as_path(path)
        files, weight_map = safetensors_files(self.path)
        self._entries: dict[str, _Entry] = {}
        for file in files:
            entries, _ = read_header(file)
            for name, entry in entries.items():
                if name in self._entries:
                    raise CorruptCheckpointError(
                        f"{self.path}: tensor {name!r} appears in both {self._entries[name].file.name} and {file.name}"
                    )
                self._entries[name] = entry
        if weight_map is not None:
            for name, file in weight_map.items():
                entry = self._entries.get(name)
                if entry is None or entry.file.name != Path(file).name:
                    raise CorruptCheckpointError(
                        f"{self.path / INDEX_FILE}: maps {name!r} to {file}, but that file has no such tensor"
                    )
            extra = sorted(set(self._entries) - set(weight_map))
            if extra:
                raise CorruptCheckpointError(
                    f"{self.path / INDEX_FILE}: tensor {extra[0]!r} is stored but missing from the index"
                )
        self._handles: dict[Path, object] = {}
        self._lock = threading.Lock()  # conversions read several tensors at once

    def tensors(self) -> dict[str, TensorInfo]:
        return {name: TensorInfo(name, e.shape, e.dtype) for name, e in self._entries.items()}

    def read(self, name: str, index: Index | None = None) -> np.ndarray:
        entry = self._entries.get(name)
        if entry is None:
            raise TensorNotFoundError(f"{self.path}: no tensor {name!r}")
        if not entry.shape or not index:
            arr = self._read_rows(entry, 0, entry.shape[0] if entry.shape else 1).reshape(entry.shape)
            return arr if index is None else arr[index]
        rows, lead, rest = entry.shape[0], index[0], tuple(index[1:])
        # Leading-axis ranges are contiguous in the file: read only those rows.
        if isinstance(lead, slice):
            selected = range(*lead.indices(rows))
            if not selected:
                return self._read_rows(entry, 0, 0)[(slice(None),) + rest]
            lo, hi = min(selected), max(selected) + 1
            block = self._read_rows(entry, lo, hi)
            if selected.step != 1:
                block = block[np.asarray(selected) - lo]  # strided rows: read the span, keep every step-th
            return block[(slice(None),) + rest]
        row = int(lead) + rows if int(lead) < 0 else int(lead)
        if not 0 <= row < rows:
            raise IndexError(f"{name}: row {int(lead)} out of range for {rows} rows")
        return self._read_rows(entry, row, row + 1)[0][rest]

    def _read_rows(self, entry: _Entry, start: int, stop: int) -> np.ndarray:
        rows = entry.shape[0] if entry.shape else 1
        row_bytes = (entry.end - entry.begin) // max(rows, 1)
        block = self._read_bytes(entry, entry.begin + start * row_bytes, (stop - start) * row_bytes)
        return block.view(entry.dtype).reshape((stop - start,) + tuple(entry.shape[1:]))

    def _read_bytes(self, entry: _Entry, offset: int, length: int) -> np.ndarray:
        buf = np.empty(length, np.uint8)
        if is_url(entry.file):  # a bucket: parallel ranged reads
            if objects.read_into(entry.file, offset, memoryview(buf)) != length:
                raise CorruptCheckpointError(
                    f"{entry.file}: short read at byte {offset} (object changed or truncated?)"
                )
            return buf
        got = _pread_all(self._fd(entry.file), memoryview(buf), offset)
        if got != length:
            raise CorruptCheckpointError(
                f"{entry.file}: short read at byte {offset + got} (file changed or truncated?)"
            )
        return buf

    def _fd(self, file: Path) -> int:
        with self._lock:  # one descriptor per file, however many threads read (pread shares it safely)
            fd = self._handles.get(file)
            if fd is None:
                fd = os.open(file, os.O_RDONLY)
                self._handles[file] = fd
            return fd  # type: ignore[return-value]

    def close(self) -> None:
        for fd in self._handles.values():
            os.close(fd)  # type: ignore[arg-type]
        self._handles.clear()

    def __enter__(self) -> "SafetensorsReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------- writing


def _header_bytes(
    entries: Sequence[tuple[str, np.dtype, tuple[int, ...]]], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[int]]:
    """Header (length prefix included, padded to 8 bytes) and each tensor's data offset."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offsets, pos = [], 0
    for name, dtype, shape in entries:
        if np.dtype(dtype) not in DTYPE_NAMES:
            raise ConversionError(f"tensor {name!r}: dtype {np.dtype(dtype)} cannot be stored in safetensors")
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {
            "dtype": DTYPE_NAMES[np.dtype(dtype)],
            "shape": list(shape),
            "data_offsets": [pos, pos + nbytes],
        }
        offsets.append(pos)
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offsets


class SafetensorsWriter:
    """Writes tensors into `directory` as one file or `model-0000i-of-0000N` shards plus an index.

    Shards fill greedily in write order; a tensor larger than the limit gets a
    shard of its own. Pass `plan` (TensorInfo of every tensor, in write order)
    to stream each tensor straight to disk; otherwise a shard is buffered.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
        plan: Sequence[TensorInfo] | None = None,
        metadata: Mapping[str, str] | None = None,
        share: Any = None,
    ):
        self.directory = normalize(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_shard_size = parse_size(max_shard_size)
        self.metadata = dict(metadata or {"format": "pt"})
        self._shards: list[list[tuple[str, np.dtype, tuple[int, ...]]]] = []
        self._pending: list[tuple[str, np.ndarray]] = []  # buffered mode only
        self._pending_bytes = 0
        self._plan: dict[str, tuple[int, int]] | None = None  # name -> (shard, offset)
        self._written: set[str] = set()
        # the shards being written: their files, large writes straight to the disk
        self._open: dict[int, DirectWrites] = {}
        self._done: set[int] = set()  # shards closed (and, in a bucket conversion, uploaded) already
        # A multi-process conversion (maxckpt.conversion.distributed.Share): this process writes the
        # shards of its own tensors, numbered among every process's shards; process 0 writes the index.
        self._first, self._total = 0, None
        if share is not None:
            counts = [len(shard_layout(share.infos_of(r), self.max_shard_size)) for r in range(share.size)]
            self._first, self._total = sum(counts[: share.rank]), sum(counts)
            plan = share.mine
        if plan is not None:
            self._layout_plan(plan)

    # -- planning

    def _layout_plan(self, plan: Sequence[TensorInfo]) -> None:
        self._shards = shard_layout(plan, self.max_shard_size)
        self._plan = {}
        self._headers: list[bytes] = []
        for k, shard in enumerate(self._shards):
            header, offsets = _header_bytes(shard, self.metadata)
            self._headers.append(header)
            for (name, _, _), off in zip(shard, offsets):
                self._plan[name] = (k, len(header) + off)

    def _shard_path(self, k: int, total: int) -> Path:
        if self._total is not None:
            k, total = self._first + k, self._total
        return self.directory / shard_name(k, total)

    def _shard(self, k: int) -> DirectWrites:
        """Shard `k`'s file, created with its header at first use."""
        shard = self._open.get(k)
        if shard is None and k in self._done:
            raise ConversionError(f"shard {k + 1} is complete already; tensors must be written in the planned order")
        if shard is None:
            for done in [j for j in self._open if j < k]:  # shards fill in write order: earlier ones are complete
                self._finish_shard(done)
            path = self._shard_path(k, len(self._shards))
            shard = self._open[k] = DirectWrites(path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
            pwrite_all(shard.fd, memoryview(self._headers[k]), 0)
        return shard

    # -- writing

    def write(self, name: str, array: np.ndarray) -> None:
        array = np.asarray(array)
        if name in self._written:
            raise ConversionError(f"tensor {name!r} written twice")
        if self._plan is None:
            self._buffer(name, array)
            return
        k, offset = self._planned(name, array.shape, array.dtype)
        shard = self._shard(k)
        shard.pwrite(_bytes_of(array), offset)
        libc.start_writeback(shard.fd, offset, array.nbytes)  # the edges written through the page cache
        self._written.add(name)

    def write_pieces(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype, pieces: Iterable[tuple[Index, np.ndarray]]
    ) -> None:
        if self._plan is None:
            whole = np.empty(shape, dtype)
            for index, part in pieces:
                whole[index] = part
            self.write(name, whole)
            return
        k, offset = self._planned(name, tuple(shape), np.dtype(dtype))
        row_bytes = math.prod(shape[1:]) * np.dtype(dtype).itemsize
        shard = self._shard(k)
        fd = shard.fd
        whole = None  # pieces that do not split the leading axis are assembled in memory
        for index, part in pieces:
            part = np.ascontiguousarray(np.asarray(part, dtype))
            if part.shape != index_shape(shape, index):
                raise ConversionError(
                    f"tensor {name!r}: piece {index} has shape {part.shape}, expected {index_shape(shape, index)}"
                )
            lead = index[0] if index else slice(None)
            leading = all(isinstance(i, slice) and i == slice(None) for i in index[1:]) and (
                not isinstance(lead, slice) or lead.step in (None, 1)
            )
            if whole is None and leading:
                start = int(lead) if not isinstance(lead, slice) else lead.indices(shape[0])[0]
                shard.pwrite(_bytes_of(part), offset + start * row_bytes)
                continue
            if whole is None:
                # Pieces tile the tensor: bytes already written are read back, later pieces fill the rest.
                whole = np.zeros(shape, dtype)
                _pread_all(fd, memoryview(whole.reshape(-1).view(np.uint8)), offset)
            whole[index] = part
        if whole is not None:
            shard.pwrite(_bytes_of(whole), offset)
        libc.start_writeback(fd, offset, math.prod(shape) * np.dtype(dtype).itemsize)
        self._written.add(name)

    def _finish_shard(self, k: int) -> None:
        """Close a complete shard; in a bucket conversion's spool it is uploaded now (see storage.outputs)."""
        shard = self._open.pop(k)
        self._done.add(k)
        shard.close()
        os.fsync(shard.fd)
        os.close(shard.fd)
        outputs.file_done(self._shard_path(k, len(self._shards)))

    def _planned(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, int]:
        assert self._plan is not None
        if name not in self._plan:
            raise ConversionError(f"tensor {name!r} is not in the writer's plan")
        k, offset = self._plan[name]
        planned = next(e for e in self._shards[k] if e[0] == name)
        if planned[1] != np.dtype(dtype) or planned[2] != tuple(shape):
            raise ConversionError(
                f"tensor {name!r}: writing {np.dtype(dtype)}{list(shape)}, planned {planned[1]}{list(planned[2])}"
            )
        return k, offset

    def _buffer(self, name: str, array: np.ndarray) -> None:
        if self._pending and self._pending_bytes + array.nbytes > self.max_shard_size:
            self._flush_buffer()
        self._pending.append((name, array))
        self._pending_bytes += array.nbytes
        self._written.add(name)

    def _flush_buffer(self) -> None:
        # Shard count is unknown while buffering: write under a temporary name, rename in close().
        entries = [(n, a.dtype, a.shape) for n, a in self._pending]
        header, _ = _header_bytes(entries, self.metadata)
        k = len(self._shards)
        with open(self.directory / f".shard-{k}.tmp", "wb") as f:
            f.write(header)
            for _, a in self._pending:
                f.write(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
        self._shards.append(entries)
        self._pending, self._pending_bytes = [], 0

    def close(self) -> None:
        """Finish the shards and write the index (when there is more than one shard)."""
        if self._plan is None:
            if self._pending or not self._shards:
                self._flush_buffer()
            total = len(self._shards)
            for k in range(total):
                os.replace(self.directory / f".shard-{k}.tmp", self._shard_path(k, total))
        else:
            missing = [n for n in self._plan if n not in self._written]
            if missing:
                raise ConversionError(f"tensor {missing[0]!r} was planned but never written")
            for k in range(len(self._shards)):
                if k not in self._done:
                    self._shard(k)  # a shard of empty tensors still gets its file
            for k in list(self._open):
                self._finish_shard(k)
        if self._total is None and len(self._shards) > 1:
            _write_index(self.directory, self._shards)

    def finish_shares(self, share: Any) -> None:
        """Process 0 of a multi-process conversion, once every process closed its writer: the index of all shards."""
        shards = [s for r in range(share.size) for s in shard_layout(share.infos_of(r), self.max_shard_size)]
        present = outputs.output_names(self.directory)  # the bucket's objects, for a bucket DST
        for k in range(len(shards)):
            if shard_name(k, len(shards)) not in present:
                raise ConversionError(
                    f"{outputs.where(self.directory)}: shard {shard_name(k, len(shards))} is missing after every "
                    "process finished"
                )
        if len(shards) > 1:
            _write_index(self.directory, shards)


def shard_name(k: int, total: int) -> str:
    """File name of shard `k` (from 0) of `total`: HF's `model-0000k-of-0000N.safetensors`."""
    return SINGLE_FILE if total == 1 else f"model-{k + 1:05d}-of-{total:05d}.safetensors"


def shard_layout(plan: Sequence[TensorInfo], max_shard_size: int) -> list[list[tuple[str, np.dtype, tuple[int, ...]]]]:
    """Tensors of `plan` grouped into shards, greedily in order; a tensor above the limit gets its own."""
    shards: list[list[tuple[str, np.dtype, tuple[int, ...]]]] = [[]]
    size = 0
    for info in plan:
        if shards[-1] and size + info.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append((info.name, np.dtype(info.dtype), tuple(info.shape)))
        size += info.nbytes
    return [s for s in shards if s]


def _write_index(directory: Path, shards: Sequence[Sequence[tuple[str, np.dtype, tuple[int, ...]]]]) -> None:
    total = len(shards)
    weight_map = {name: shard_name(k, total) for k, shard in enumerate(shards) for name, _, _ in shard}
    total_size = sum(math.prod(s) * np.dtype(d).itemsize for shard in shards for _, d, s in shard)
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _bytes_of(array: np.ndarray) -> memoryview:
    """The bytes of `array` in C order, as a flat byte view (copied only if `array` is not C-contiguous)."""
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _pread_all(fd: int, view: memoryview, offset: int) -> int:
    """Fill `view` from `offset`; returns the bytes read (fewer only at end of file).

    One read moves at most ~2 GiB on Linux (a tensor of 2 GiB or more needs
    several), and any read may be short: loop until done or end of file.
    """
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got
