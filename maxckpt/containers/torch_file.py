"""Plain `torch.save` state dicts: one file, or sharded `.bin` files as transformers writes them.

Reading uses `torch.load(weights_only=True, mmap=True)`: no code in the file
runs, and tensors stay on disk until a slice of them is used. Writing streams:
each tensor's bytes go into the zip archive as it arrives and the pickle that
names them is written last, so memory holds one tensor - the same file
`torch.save(state_dict)` would produce, which `torch.load` (and transformers'
`from_pretrained` for `pytorch_model*.bin`) read as usual.

Sharded output: `pytorch_model-00001-of-00003.bin` ... plus
`pytorch_model.bin.index.json` (`{"metadata": {"total_size": N}, "weight_map":
{name: file}}`); a model that fits one shard is a single `pytorch_model.bin`.

>>> import numpy as np, tempfile, os
>>> d = tempfile.mkdtemp()
>>> with TorchFileWriter(os.path.join(d, "model.pt")) as w:
...     w.write("w", np.arange(4, dtype=np.float32))
>>> TorchFileReader(os.path.join(d, "model.pt")).read("w", (slice(1, 3),)).tolist()
[1.0, 2.0]
"""

from __future__ import annotations

import collections
import ctypes
import io
import json
import math
import os
import pickle
import threading
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from maxckpt.containers.base import ClosesOrAborts
from maxckpt import libc
from maxckpt.storage.bounded import check_torch_file, read_json_object
from maxckpt.containers.direct_io import MIN_DIRECT, DirectWrites
from maxckpt.containers.torch_arrays import to_numpy, to_torch
from maxckpt.containers.torch_safety import load_weights_only
from maxckpt.errors import (
    CheckpointNotFoundError,
    ConversionError,
    CorruptCheckpointError,
    ShapeMismatchError,
    TensorNotFoundError,
    UnsupportedModelError,
)
from maxckpt.tensors import Index, TensorInfo
from maxckpt.storage import objects
from maxckpt.storage.outputs import file_done as outputs_done
from maxckpt.storage.outputs import output_names
from maxckpt.storage.urls import as_path, is_url, normalize

__all__ = ["INDEX_FILE", "SINGLE_FILE", "TorchFileReader", "TorchFileWriter", "is_torch_checkpoint"]

SINGLE_FILE = "pytorch_model.bin"
INDEX_FILE = "pytorch_model.bin.index.json"
_SUFFIXES = (".bin", ".pt", ".pth")
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # transformers' default "5GB"


def is_torch_checkpoint(path: str | os.PathLike) -> bool:
    """True for a torch state-dict file or a directory holding `pytorch_model*.bin`."""
    p = as_path(path)
    if p.is_file():
        return p.suffix in _SUFFIXES
    return (p / INDEX_FILE).is_file() or (p / SINGLE_FILE).is_file()


# --------------------------------------------------------------------------
# Reading


_MADVISE = (
    libc.function("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
    if sys.platform.startswith("linux")
    else None
)
_MADV_DONTNEED = 4  # Linux
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def release_pages(t: torch.Tensor) -> None:
    """Unmap the whole pages of a memory-mapped tensor from this process once it has been copied.

    Why: the pages a read touches stay mapped, and count in the process's
    RSS, until the file is closed - a whole checkpoint's worth by the end of
    a conversion, although the kernel could drop them. torch maps files
    privately and read-only use never dirties a page, so MADV_DONTNEED only
    forgets them: a later read of the same bytes faults them back in from the
    file (or the page cache). Never call this on tensors loaded into memory.
    """
    if _MADVISE is None or t.numel() == 0:
        return
    storage = t.untyped_storage()  # the whole record: views of it (tied weights) just fault back in
    start = storage.data_ptr()
    end = start + storage.nbytes()
    first, last = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if last > first:
        _MADVISE(first, last - first, _MADV_DONTNEED)


class TorchFileReader:
    """Lazy reader of a torch state dict file or a sharded `pytorch_model*.bin` dir (a `TensorReader`).

    Files are memory-mapped (`mmap=True`) so listing and reading a slice does
    not load the whole file; files in torch's legacy (pre-1.6, non-zip) format
    cannot be mapped and are loaded whole.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = as_path(path)
        if self.path.is_file():
            self._files = {self.path.name: self.path}
            self._where: dict[str, str] | None = None
        elif (self.path / INDEX_FILE).is_file():
            index_path = self.path / INDEX_FILE
            try:
                weight_map = read_json_object(index_path)["weight_map"]
                self._where = {str(k): v for k, v in weight_map.items()}
                # Shards are file names inside this directory (what transformers writes).
                for file in self._where.values():
                    if not isinstance(file, str) or Path(file).name != file:
                        raise ValueError(f"weight_map names {file!r}, not a file in this directory")
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise CorruptCheckpointError(f"{index_path}: not a valid index ({type(e).__name__}: {e})") from None
            self._files = {f: self.path / f for f in sorted(set(self._where.values()))}
            missing = [f for f, p in self._files.items() if not p.is_file()]
            if missing:
                raise CorruptCheckpointError(f"{index_path}: names shard files that are missing: {missing[:5]}")
        elif (self.path / SINGLE_FILE).is_file():
            self._files = {SINGLE_FILE: self.path / SINGLE_FILE}
            self._where = None
        else:
            raise CheckpointNotFoundError(
                f"{self.path}: no torch checkpoint here (expected a .bin/.pt file, {SINGLE_FILE} or {INDEX_FILE})"
            )
        self._loaded: dict[str, dict[str, torch.Tensor]] = {}
        self._mapped: set[str] = set()  # files whose tensors are memory-mapped (not loaded into memory)
        self._load_lock = threading.Lock()
        self._infos: dict[str, TensorInfo] | None = None

    def _load(self, file: str) -> dict[str, torch.Tensor]:
        sd = self._loaded.get(file)
        if sd is not None:
            return sd
        with self._load_lock:  # conversions read several tensors at once: map each file once
            sd = self._loaded.get(file)
            return sd if sd is not None else self._load_file(file)

    def _load_file(self, file: str) -> dict[str, torch.Tensor]:
        path = self._files[file]
        try:
            if is_url(path):  # a bucket: no mmap; the shard is read whole (one shard at a time is held)
                with objects.open_read(path) as f:
                    check_torch_file(f)  # nesting bounded before torch unpickles it
                    f.seek(0)
                    sd = load_weights_only(f)
            else:
                check_torch_file(path)  # nesting bounded before torch unpickles it
                sd = None
            try:
                if sd is None:
                    sd = load_weights_only(path, mmap=True)
                    self._mapped.add(file)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                # Legacy (non-zip) torch.save format: cannot be memory-mapped.
                sd = load_weights_only(path)
        except pickle.UnpicklingError as e:
            raise CorruptCheckpointError(
                f"{path}: refused to load: it holds objects beyond tensors and plain data, and unpickling "
                f"them could run code ({str(e).splitlines()[0][:200]})"
            ) from None
        except Exception as e:
            raise CorruptCheckpointError(
                f"{path}: not a readable torch.save file ({type(e).__name__}: {str(e)[:200]})"
            ) from None
        if not isinstance(sd, dict):
            raise CorruptCheckpointError(f"{path}: holds a {type(sd).__name__}, expected a state dict")
        tensors = {str(k): v for k, v in sd.items() if isinstance(v, torch.Tensor)}
        self._loaded[file] = tensors
        return tensors

    def _file_of(self, name: str) -> str:
        if self._where is None:
            return next(iter(self._files))
        try:
            return self._where[name]
        except KeyError:
            raise TensorNotFoundError(f"{self.path}: no tensor named {name!r}") from None

    def tensors(self) -> dict[str, TensorInfo]:
        """Name, shape and dtype of every tensor (maps the files; reads no tensor data)."""
        if self._infos is None:
            from maxckpt.containers.torch_arrays import numpy_dtype

            infos: dict[str, TensorInfo] = {}
            for file in self._files:
                for name, t in self._load(file).items():
                    if self._where is not None and self._where.get(name) != file:
                        continue
                    try:
                        infos[name] = TensorInfo(name, tuple(t.shape), numpy_dtype(t.dtype))
                    except TypeError as e:  # e.g. torch.uint16, which numpy cannot hold bit-exactly here
                        raise UnsupportedModelError(f"{self._files[file]}: tensor {name!r}: {e}") from None
            if self._where is not None:
                absent = [n for n in self._where if n not in infos]
                if absent:
                    raise CorruptCheckpointError(
                        f"{self.path / INDEX_FILE}: lists tensors its shard files do not hold: {absent[:5]}"
                    )
            self._infos = infos
        return dict(self._infos)

    def read(self, name: str, index: Index | None = None) -> np.ndarray:
        """Tensor `name` (or `tensor[index]`) as a numpy array (a copy, independent of the file)."""
        file = self._file_of(name)
        sd = self._load(file)
        if name not in sd:
            raise TensorNotFoundError(f"{self.path}: no tensor named {name!r}")
        t = whole = sd[name]
        if index is not None:
            t = t[index]
        out = np.array(to_numpy(t.contiguous()), copy=True)
        if file in self._mapped:
            release_pages(whole)
        return out

    def close(self) -> None:
        """Drop the memory maps."""
        self._loaded.clear()

    def __enter__(self) -> "TorchFileReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------
# Writing: torch.save's zip format, one record per tensor as it arrives


class _SavedTensor:
    """Stands in for a tensor whose bytes are already in the archive, when the pickle is written."""

    def __init__(self, key: str, dtype: torch.dtype, shape: tuple[int, ...]):
        self.key, self.dtype, self.shape = key, dtype, shape


class _SavedStorage:
    def __init__(self, saved: _SavedTensor):
        self.saved = saved


class _StatePickler(pickle.Pickler):
    """Pickles a dict of `_SavedTensor`s exactly as `torch.save` pickles real tensors."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _SavedStorage):
            s = obj.saved
            storage_type = getattr(torch, torch.storage._dtype_to_storage_type_map()[s.dtype])
            return ("storage", storage_type, s.key, "cpu", math.prod(s.shape))
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _SavedTensor):
            stride, acc = [], 1
            for d in reversed(obj.shape):
                stride.append(acc)
                acc *= d
            return (
                torch._utils._rebuild_tensor_v2,
                (
                    _SavedStorage(obj),
                    0,
                    torch.Size(obj.shape),
                    tuple(reversed(stride)),
                    False,
                    collections.OrderedDict(),
                ),
            )
        return NotImplemented


class FailSafeStream(io.RawIOBase):
    """A write-only stream for torch's C++ zip writer that never lets an OS error reach C++.

    torch's `PyTorchStreamWriter` finishes the archive in its destructor; when
    a write fails there (a full disk) the C++ exception escapes a destructor
    and the interpreter aborts. So the first failed write is recorded,
    later writes are dropped, and the owner re-raises :attr:`error` itself
    (:meth:`check`) after each record. It forwards writes only (no seek or
    tell), so `torch.save` into it writes a self-contained zip blob.

    With `direct` (the raw file's :class:`DirectWrites`), a large write - a
    tensor's bytes - goes to the disk through it at the raw file's position,
    which then moves past it.
    """

    def __init__(self, raw: Any, direct: DirectWrites | None = None):
        self._raw = raw
        self._direct = direct
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        size = memoryview(b).nbytes
        if self.error is None:
            try:
                view = memoryview(b).cast("B")
                if self._direct is not None and size >= MIN_DIRECT:
                    self._raw.flush()  # a buffered file's bytes before this position are in it first
                    at = self._raw.tell()
                    self._direct.pwrite(view, at)
                    self._raw.seek(at + size)
                    return size
                while len(view):  # a raw write may be short: loop until all of it is written
                    n = self._raw.write(view)
                    view = view[n if n is not None else len(view) :]
            except OSError as err:
                self.error = err
        return size

    def check(self) -> None:
        """Raise the first write error, if any."""
        if self.error is not None:
            raise self.error


def _writer_options() -> tuple:
    """What `torch.save` passes its zip writer (CRC32 on or off, storage alignment), where this torch has them."""
    ser = torch.serialization
    if hasattr(ser, "get_crc32_options") and hasattr(ser, "_get_storage_alignment"):
        return ser.get_crc32_options(), ser._get_storage_alignment()
    return ()


class _ArchiveWriter:
    """One `torch.save`-format file, written tensor by tensor."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "wb", buffering=0)
        self._direct = DirectWrites(path, self._file.fileno())  # tensor bytes straight to the disk
        self._stream = FailSafeStream(self._file, self._direct)
        self._zip = torch._C.PyTorchFileWriter(self._stream, *_writer_options())
        self._state: dict[str, _SavedTensor] = {}
        self.nbytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        key = str(len(self._state))
        tensor = tensor.contiguous()
        storage = tensor.untyped_storage()
        if storage.nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone()  # a view would write its whole base storage
            storage = tensor.untyped_storage()
        start = self._file.tell()
        self._zip.write_record(f"data/{key}", storage, storage.nbytes())
        self._stream.check()
        # so close()'s fsync has little left
        libc.start_writeback(self._file.fileno(), start, self._file.tell() - start)
        self._state[name] = _SavedTensor(key, tensor.dtype, tuple(tensor.shape))
        self.nbytes += storage.nbytes()

    def __len__(self) -> int:
        return len(self._state)

    def close(self) -> None:
        buf = io.BytesIO()
        _StatePickler(buf, protocol=2).dump(self._state)
        data = buf.getvalue()
        self._zip.write_record("data.pkl", data, len(data))
        self._zip.write_record(".format_version", "1", 1)
        alignment = str(torch.serialization._get_storage_alignment())
        self._zip.write_record(".storage_alignment", alignment, len(alignment))
        self._zip.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        self._zip.write_end_of_file()
        self._stream.check()
        self._direct.close()
        try:
            os.fsync(self._file.fileno())
        finally:
            self._file.close()

    def discard(self) -> None:
        """Finish the archive into the void (no write can fail now) and close the file."""
        if self._stream.error is None:
            self._stream.error = OSError("discarded")
        try:
            self._zip.write_end_of_file()
        except RuntimeError:
            pass
        self._direct.close()
        self._file.close()


class TorchFileWriter(ClosesOrAborts):
    """Writes a torch state dict one tensor at a time (a `TensorWriter`).

    `path` ending in `.bin`/`.pt`/`.pth` (or `single=True`): one file. Otherwise a directory of
    `pytorch_model*.bin` shards of at most `max_shard_size` bytes (a tensor
    larger than that gets its own shard) plus the index; one shard is written
    as plain `pytorch_model.bin`. Shards are written under temporary names and
    renamed by `close()`, so an interrupted write leaves no valid-looking model.
    """

    def __init__(
        self, path: str | os.PathLike, max_shard_size: int = DEFAULT_MAX_SHARD_SIZE, *, single: bool | None = None,
        share: Any = None,
    ):
        self.path = normalize(path)
        # single=None: decided by the suffix; the conversion pipeline passes it, as it writes to a temporary name.
        self.single = self.path.suffix in _SUFFIXES if single is None else bool(single)
        self.max_shard_size = int(max_shard_size)
        # A multi-process conversion (maxckpt.conversion.distributed.Share): this process writes the shards of
        # its own tensors into the shared folder, numbered among every process's shards; process 0 the index.
        self.share = share
        self._first, self._count, self._all = 0, None, None
        if share is not None:
            if self.single:
                raise ConversionError(
                    f"{self.path}: one torch.save file is written by one process; give several processes a folder "
                    "DST (shards of pytorch_model-*.bin), or convert to one file without --num-processes"
                )
            counts = [shard_count(share.infos_of(r), self.max_shard_size) for r in range(share.size)]
            self._first, self._count, self._all = sum(counts[: share.rank]), counts[share.rank], sum(counts)
        if self.single:
            if self.path.exists():
                raise ConversionError(f"{self.path}: already exists; choose a new output file")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            if share is None and ((self.path / INDEX_FILE).exists() or (self.path / SINGLE_FILE).exists()):
                raise ConversionError(f"{self.path}: already holds a torch checkpoint; choose an empty directory")
            self.path.mkdir(parents=True, exist_ok=True)
        self._shards: list[tuple[Path, list[str]]] = []
        self._current: _ArchiveWriter | None = None
        self._names: set[str] = set()
        self._total = 0
        self._closed = False

    def _archive_for(self, nbytes: int) -> _ArchiveWriter:
        cur = self._current
        if cur is not None and (self.single or len(cur) == 0 or cur.nbytes + nbytes <= self.max_shard_size):
            return cur
        if cur is not None:
            cur.close()
        tmp = (self.path.parent / f".{self.path.name}.tmp") if self.single else (
            self.path / f".shard-{self._first + len(self._shards):05d}.tmp"  # numbered among every process's
        )
        self._current = _ArchiveWriter(tmp)
        self._shards.append((tmp, []))
        return self._current

    def write(self, name: str, array: np.ndarray) -> None:
        """Add one tensor (numpy, bfloat16 through ml_dtypes) to the state dict."""
        if self._closed:
            raise ValueError(f"{self.path}: writer is closed")
        if name in self._names:
            raise ValueError(f"{self.path}: tensor {name!r} written twice")
        tensor = to_torch(np.asarray(array))
        nbytes = tensor.numel() * tensor.element_size()
        archive = self._archive_for(nbytes)
        archive.add(name, tensor)
        self._shards[-1][1].append(name)
        self._names.add(name)
        self._total += nbytes

    def write_pieces(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype, pieces: Iterable[tuple[Index, np.ndarray]]
    ) -> None:
        """Assemble a tiled tensor and write it (a torch.save record is one contiguous tensor)."""
        out = np.empty(tuple(shape), dtype=dtype)
        covered = 0
        for index, part in pieces:
            view = out[tuple(index)]
            part = np.asarray(part)
            if part.size != view.size:
                raise ShapeMismatchError(f"{name}: piece {index} has shape {part.shape}, the slot is {view.shape}")
            view[...] = part.reshape(view.shape)
            covered += part.size
        if covered != out.size:
            raise ShapeMismatchError(f"{name}: pieces cover {covered} of {out.size} elements")
        self.write(name, out)

    def close(self) -> None:
        """Finish the last file, name the shards, write the index."""
        if self._closed:
            return
        self._closed = True
        if self.share is not None:
            self._close_share()
            return
        if self._current is None:
            self._archive_for(0)
        self._current.close()
        if self.single:
            os.replace(self._shards[0][0], self.path)
            return
        n = len(self._shards)
        if n == 1:
            os.replace(self._shards[0][0], self.path / SINGLE_FILE)
            return
        weight_map = {}
        for k, (tmp, names) in enumerate(self._shards):
            final = f"pytorch_model-{k + 1:05d}-of-{n:05d}.bin"
            os.replace(tmp, self.path / final)
            weight_map.update({name: final for name in names})
        index = {"metadata": {"total_size": self._total}, "weight_map": weight_map}
        tmp_index = self.path / f".{INDEX_FILE}.tmp"
        tmp_index.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        os.replace(tmp_index, self.path / INDEX_FILE)

    def _close_share(self) -> None:
        """This process's shards under their final names (`-of-` every process's count); no index (process 0's)."""
        if self._current is not None:
            self._current.close()
        if len(self._shards) != self._count:  # the names would not tile the folder: never publish that
            raise ConversionError(
                f"{self.path}: wrote {len(self._shards)} torch shards where the plan has {self._count}; "
                "the tensors were not written in the planned order"
            )
        for k, (tmp, _) in enumerate(self._shards):
            final = self.path / _shard_name(self._first + k, self._all)
            os.replace(tmp, final)
            outputs_done(final)

    def finish_shares(self, share: Any) -> None:
        """Process 0, once every process closed its writer: the index of all shards (none for one shard)."""
        shards = [s for r in range(share.size) for s in _shard_layout(share.infos_of(r), self.max_shard_size)]
        present = output_names(self.path)  # the bucket's objects, for a bucket DST
        names = [_shard_name(k, len(shards)) for k in range(len(shards))]
        missing = [n for n in names if n not in present]
        if missing:
            raise ConversionError(f"{self.path}: torch shard {missing[0]} is missing after every process finished")
        if len(shards) == 1:
            return
        weight_map = {info.name: name for name, shard in zip(names, shards) for info in shard}
        total = sum(info.nbytes for shard in shards for info in shard)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        tmp_index = self.path / f".{INDEX_FILE}.tmp"
        tmp_index.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        os.replace(tmp_index, self.path / INDEX_FILE)

    def abort(self) -> None:
        """Stop and remove the temporary shard files."""
        if self._closed:
            return
        self._closed = True
        if self._current is not None:
            self._current.discard()
        for tmp, _ in self._shards:
            tmp.unlink(missing_ok=True)


def _shard_layout(infos: Iterable[TensorInfo], max_shard_size: int) -> list[list[TensorInfo]]:
    """`infos` in shards as :meth:`TorchFileWriter._archive_for` fills them: in order, a new one when the next
    tensor would pass the limit (a tensor above it alone)."""
    shards: list[list[TensorInfo]] = [[]]
    size = 0
    for info in infos:
        if shards[-1] and size + info.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(info)
        size += info.nbytes
    return [s for s in shards if s]


def shard_count(infos: Iterable[TensorInfo], max_shard_size: int) -> int:
    """How many `pytorch_model-*.bin` shards a writer of these tensors, in this order, writes."""
    return len(_shard_layout(infos, max_shard_size))


def _shard_name(k: int, total: int) -> str:
    return SINGLE_FILE if total == 1 else f"pytorch_model-{k + 1:05d}-of-{total:05d}.bin"
