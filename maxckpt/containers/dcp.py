"""PyTorch Distributed Checkpoint (DCP) directories, read and written lazily.

DCP is what Megatron-Core's `torch_dist` format and TorchTitan both store: a
directory with a pickled `.metadata` (every item's global shape, dtype and the
chunks it is stored as) and `__{rank}_{n}.distcp` data files in which each
tensor chunk is a complete `torch.save` blob at a recorded offset, and each
non-tensor item ("bytes" item) is a `torch.save` of the object.

Reading never unpickles code: `.metadata` goes through a restricted unpickler
that admits only DCP's metadata classes (and Megatron's `MCoreMetadata`,
mapped onto the base class), and data blobs are loaded with
`torch.load(weights_only=True)` (a tensor chunk onto the meta device, then
viewed in the bytes read: `maxckpt.containers.torch_blobs`). Writing
produces exactly what `torch.distributed.checkpoint.save` writes for one
rank, one chunk at a time, so stock `torch.distributed.checkpoint.load` reads
it with or without a process group, and a stacked `[L, ...]` tensor is
written one layer chunk at a time.

>>> import numpy as np, tempfile
>>> d = tempfile.mkdtemp()
>>> with DcpWriter(d) as w:
...     w.write("w", np.arange(6, dtype=np.float32).reshape(2, 3))
>>> DcpReader(d).read("w", (1,)).tolist()
[3.0, 4.0, 5.0]
"""

from __future__ import annotations

import io
import math
import os
import pickle
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from torch.distributed.checkpoint import metadata as dcp_md
from torch.distributed.checkpoint import planner as dcp_planner
from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix

from maxckpt.containers.base import ClosesOrAborts
from maxckpt import libc
from maxckpt.storage.bounded import BoundsError, check_torch_file, scan_pickle, special_kind
from maxckpt.containers.torch_safety import load_weights_only
from maxckpt.containers.torch_blobs import MemoryFile, tensor_view
from maxckpt.containers.torch_arrays import numpy_dtype, to_numpy, to_torch
from maxckpt.containers.direct_io import DirectWrites
from maxckpt.containers.torch_file import FailSafeStream
from maxckpt.errors import CheckpointNotFoundError, CorruptCheckpointError, ShapeMismatchError, TensorNotFoundError
from maxckpt.tensors import Index, TensorInfo
from maxckpt.storage import objects, outputs
from maxckpt.storage.urls import as_path, normalize

METADATA_FILE = ".metadata"
DATA_FILE = "__0_0.distcp"
# What torch 2.13's FileSystemWriter stamps; loaders accept older and newer.
DCP_VERSION = "1.0.0"

__all__ = ["DcpChunk", "DcpReader", "DcpWriter", "load_metadata"]


# --------------------------------------------------------------------------
# .metadata: a pickle, so read it with an allow-list


def torch_enum_value(name: str) -> Any:
    """`torch.<name>` when it is a dtype, layout or memory format (plain values a pickle may name), else None."""
    value = getattr(torch, name, None)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return value
    return None


# Globals a pickle of plain data names; calling them builds values and runs nothing else.
PLAIN_DATA_GLOBALS: dict[tuple[str, str], Any] = {
    ("pathlib", "PosixPath"): Path,
    ("pathlib", "PurePosixPath"): Path,
    ("pathlib", "WindowsPath"): Path,
    ("pathlib", "PureWindowsPath"): Path,
    ("collections", "OrderedDict"): dict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}


# (module, name) -> object. Everything a DCP `.metadata` written by torch 2.0 -
# 2.13 (and Megatron-Core) references; nothing here can run code when called.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch.distributed.checkpoint.metadata", "Metadata"): dcp_md.Metadata,
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"): dcp_md.TensorStorageMetadata,
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"): dcp_md.BytesStorageMetadata,
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"): dcp_md.ChunkStorageMetadata,
    ("torch.distributed.checkpoint.metadata", "TensorProperties"): dcp_md.TensorProperties,
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"): dcp_md.MetadataIndex,
    ("torch.distributed.checkpoint.metadata", "StorageMeta"): dcp_md.StorageMeta,
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): dcp_md._MEM_FORMAT_ENCODING,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"): _StoragePrefix,
    # Megatron-Core 0.16 also pickles every rank's save plan (`all_local_plans`)
    # into the metadata, to reuse it on the next save.
    ("torch.distributed.checkpoint.planner", "SavePlan"): dcp_planner.SavePlan,
    ("torch.distributed.checkpoint.planner", "WriteItem"): dcp_planner.WriteItem,
    ("torch.distributed.checkpoint.planner", "WriteItemType"): dcp_planner.WriteItemType,
    ("torch.distributed.checkpoint.planner", "TensorWriteData"): dcp_planner.TensorWriteData,
    ("torch.distributed.checkpoint.planner", "BytesIOWriteData"): dcp_planner.BytesIOWriteData,
    # Megatron-Core (older releases) pickles its Metadata subclass, which only
    # adds a `mcore_data` dict, and its SavePlan subclass; the base classes
    # read them the same way.
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata"): dcp_md.Metadata,
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlan"): dcp_planner.SavePlan,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    **PLAIN_DATA_GLOBALS,
}


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the classes in `_ALLOWED` (and torch dtypes/layouts)."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None and module == "torch":
            allowed = torch_enum_value(name)
        if allowed is None:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not a DCP metadata class")
        return allowed


def load_metadata(directory: str | os.PathLike) -> dcp_md.Metadata:
    """Read a DCP directory's `.metadata` without ever running code from it.

    A hostile pickle (one that names `os.system` or any class outside DCP's
    metadata classes) raises :class:`CorruptCheckpointError` instead of being
    executed.

    >>> md = load_metadata("step-10")          # doctest: +SKIP
    >>> sorted(md.state_dict_metadata)[:2]     # doctest: +SKIP
    ['layers.0.attention.wk.weight', 'layers.0.attention.wo.weight']
    """
    path = as_path(directory) / METADATA_FILE
    if not path.is_file():
        raise CheckpointNotFoundError(
            f"{directory}: no DCP checkpoint here ({METADATA_FILE} is missing); pass the directory "
            "that holds .metadata and the __*.distcp files"
        )
    try:
        with objects.open_read(path) as f:
            scan_pickle(f)  # nesting bounded before unpickling: deep tuples crash CPython's hash
            f.seek(0)
            md = _MetadataUnpickler(f).load()
    except BoundsError as e:
        raise CorruptCheckpointError(
            f"{path}: not a readable DCP metadata pickle ({e}); the metadata is corrupt or hostile"
        ) from None
    except OSError as e:
        raise CorruptCheckpointError(f"{path}: cannot read it ({e.strerror or e})") from None
    except pickle.UnpicklingError as e:
        raise CorruptCheckpointError(
            f"{path}: refused to load: {e}. DCP metadata is a pickle and maxckpt only admits "
            "torch.distributed.checkpoint's metadata classes, so a file that names anything else "
            "is corrupt or hostile; do not load it with torch either"
        ) from None
    # MemoryError: a length field in the pickle that claims more bytes than can be allocated.
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError, OverflowError) as e:
        raise CorruptCheckpointError(f"{path}: not a readable DCP metadata pickle ({type(e).__name__}: {e})") from None
    if not isinstance(md, dcp_md.Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise CorruptCheckpointError(f"{path}: holds {type(md).__name__}, not a DCP Metadata object")
    if not isinstance(md.storage_data, dict):
        raise CorruptCheckpointError(
            f"{path}: has no per-item storage table (storage_data is {type(md.storage_data).__name__}); "
            "only checkpoints written by DCP's FileSystemWriter are supported"
        )
    return md


# --------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class DcpChunk:
    """One stored chunk of a tensor: where it sits in the global tensor and in which file."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int
    length: int


def _check_chunk(path: Path, name: str, chunk: DcpChunk, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """A chunk must lie inside its tensor, and its blob must be big enough to hold its elements.

    The second rule bounds what a read allocates by the size of the data
    files, whatever sizes a hostile `.metadata` states.
    """
    if len(chunk.offsets) != len(shape) or len(chunk.sizes) != len(shape) or any(
        o < 0 or s < 0 or o + s > d for o, s, d in zip(chunk.offsets, chunk.sizes, shape)
    ):
        raise CorruptCheckpointError(
            f"{path / METADATA_FILE}: tensor {name!r} of shape {shape} has a chunk at offsets {chunk.offsets} "
            f"of sizes {chunk.sizes}, outside the tensor; the metadata is corrupt or hostile"
        )
    needed = math.prod(chunk.sizes) * np.dtype(dtype).itemsize
    if chunk.length < needed:
        raise CorruptCheckpointError(
            f"{path / METADATA_FILE}: tensor {name!r} chunk at {chunk.offsets} holds {chunk.length} bytes, "
            f"fewer than the {needed} its {list(chunk.sizes)} elements need; the metadata is corrupt or hostile"
        )


def _selection(index: Index | None, shape: tuple[int, ...]) -> list[tuple[int, int, int, bool]]:
    """Per dim (start, stop, step, keep_dim) of a basic index, normalised to the shape."""
    index = tuple(index or ())
    if len(index) > len(shape):
        raise IndexError(f"index {index} has more items than the tensor has dims {shape}")
    out = []
    for dim, size in enumerate(shape):
        item = index[dim] if dim < len(index) else slice(None)
        if isinstance(item, slice):
            start, stop, step = item.indices(size)
            if step <= 0:
                raise IndexError("negative slice steps are not supported for lazy reads")
            out.append((start, max(stop, start), step, True))
        else:
            i = int(item)
            if i < 0:
                i += size
            if not 0 <= i < size:
                raise IndexError(f"index {item} out of range for dim {dim} of size {size}")
            out.append((i, i + 1, 1, False))
    return out


def _overlap(sel: tuple[int, int, int, bool], lo: int, hi: int) -> tuple[slice, slice] | None:
    """(output slice, chunk-local slice) of the selected coordinates that fall in [lo, hi)."""
    start, stop, step, _ = sel
    first = start if start >= lo else start + -(-(lo - start) // step) * step
    last_excl = min(stop, hi)
    if first >= last_excl:
        return None
    count = (last_excl - first + step - 1) // step
    k0 = (first - start) // step
    return slice(k0, k0 + count), slice(first - lo, first - lo + (count - 1) * step + 1, step)


class DcpReader:
    """Lazy reader of one DCP directory (implements `TensorReader`).

    `tensors()` comes from `.metadata` alone; `read(name, index)` loads only the
    chunks the index touches, one at a time. Non-tensor items (Megatron's
    `_extra_state`, TorchTitan's dataloader state) are listed by `objects()`
    and read with `read_bytes` (the raw `torch.save` blob) or `read_object`.

    >>> r = DcpReader("iter_0000001")                                  # doctest: +SKIP
    >>> r.tensors()["decoder.layers.mlp.linear_fc2.weight"].shape      # doctest: +SKIP
    (2, 64, 128)
    >>> r.read("decoder.layers.mlp.linear_fc2.weight", (0,)).shape     # doctest: +SKIP
    (64, 128)
    """

    def __init__(self, path: str | os.PathLike, *, step: int | None = None):
        self.path = as_path(path)
        self.step = step  # the step or iteration the directory is named for (set by callers that know it)
        self.metadata = load_metadata(self.path)
        self._chunks: dict[str, list[DcpChunk]] = {}
        self._infos: dict[str, TensorInfo] = {}
        self._bytes: dict[str, DcpChunk] = {}
        try:
            self._index()
        except (AttributeError, TypeError, ValueError) as e:  # the unpickled objects hold the wrong types
            raise CorruptCheckpointError(
                f"{self.path / METADATA_FILE}: malformed DCP metadata ({type(e).__name__}: {e})"
            ) from None

    def _index(self) -> None:
        """Validate `.metadata` and index every chunk, so reads never trust a stated size or place."""
        by_key: dict[tuple[str, tuple[int, ...] | None], _StorageInfo] = {}
        for idx, info in self.metadata.storage_data.items():
            offset = None if idx.offset is None else tuple(int(o) for o in idx.offset)
            by_key[(idx.fqn, offset)] = info
        for name, item in self.metadata.state_dict_metadata.items():
            if isinstance(item, dcp_md.TensorStorageMetadata):
                try:
                    dtype = numpy_dtype(item.properties.dtype)
                except TypeError as e:
                    raise CorruptCheckpointError(f"{self.path}: tensor {name!r}: {e}") from None
                shape = tuple(int(d) for d in item.size)
                chunks = []
                for c in item.chunks:
                    offsets = tuple(int(o) for o in c.offsets)
                    info = by_key.get((name, offsets))
                    if info is None:
                        raise CorruptCheckpointError(
                            f"{self.path}: tensor {name!r} chunk at {offsets} has no storage entry in "
                            f"{METADATA_FILE}; the checkpoint was not written completely"
                        )
                    chunk = self._chunk(name, offsets, tuple(int(s) for s in c.sizes), info)
                    _check_chunk(self.path, name, chunk, shape, dtype)
                    chunks.append(chunk)
                self._chunks[name] = chunks
                sizes = {c.sizes for c in chunks}
                self._infos[name] = TensorInfo(name, shape, dtype, sizes.pop() if len(sizes) == 1 else None)
            elif isinstance(item, dcp_md.BytesStorageMetadata):
                info = by_key.get((name, None))
                if info is None:
                    raise CorruptCheckpointError(
                        f"{self.path}: object {name!r} has no storage entry in {METADATA_FILE}"
                    )
                self._bytes[name] = self._chunk(name, (), (), info)
            else:
                raise CorruptCheckpointError(f"{self.path}: item {name!r} has unknown metadata {type(item).__name__}")

    def _chunk(self, name: str, offsets: tuple[int, ...], sizes: tuple[int, ...], info: _StorageInfo) -> DcpChunk:
        if getattr(info, "transform_descriptors", None):
            from maxckpt.errors import UnsupportedModelError

            raise UnsupportedModelError(
                f"{self.path}: item {name!r} is stored with DCP extensions {list(info.transform_descriptors)} "
                "(e.g. compression); maxckpt reads plain DCP only - re-save without storage extensions"
            )
        chunk = DcpChunk(offsets, sizes, str(info.relative_path), int(info.offset), int(info.length))
        file = Path(chunk.file)
        if chunk.file and not file.parts:  # "." or "./": the checkpoint folder itself, which read as "truncated"
            raise CorruptCheckpointError(
                f"{self.path / METADATA_FILE}: item {name!r} is stored at file {chunk.file!r}, an invalid data file "
                "name (the checkpoint folder itself); the metadata is corrupt: copy the checkpoint again"
            )
        # Data files sit inside the checkpoint directory; a path out of it is hostile.
        if not chunk.file or file.is_absolute() or ".." in file.parts or chunk.offset < 0 or chunk.length < 0:
            raise CorruptCheckpointError(
                f"{self.path / METADATA_FILE}: item {name!r} is stored at file {chunk.file!r}, "
                f"bytes [{chunk.offset}, {chunk.offset + chunk.length}); the metadata is corrupt or hostile"
            )
        return chunk

    # -- listing

    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor item: name, global shape, dtype, and the chunk shape when all chunks agree."""
        return dict(self._infos)

    def chunks(self, name: str) -> list[DcpChunk]:
        """The stored chunks of tensor `name`, in storage order."""
        try:
            return list(self._chunks[name])
        except KeyError:
            raise TensorNotFoundError(self._missing(name)) from None

    def objects(self) -> list[str]:
        """Names of the non-tensor ("bytes") items."""
        return list(self._bytes)

    def planner_path(self, name: str) -> tuple[str, ...]:
        """The nested state-dict path the saver flattened `name` from (DCP's planner_data)."""
        data = self.metadata.planner_data
        if isinstance(data, dict) and name in data:
            return tuple(str(p) for p in data[name])
        return (name,)

    # -- reading

    def _check_stored(self, chunk: DcpChunk, name: str) -> None:
        """The chunk's bytes are in its data file; checked before anything is allocated for it."""
        path = self.path / chunk.file
        kind = special_kind(path)  # a FIFO or folder has no bytes to give: it is no truncated data file
        if kind is not None:
            raise CorruptCheckpointError(
                f"{path}: data file of item {name!r} is {kind}, not a regular file; put the real .distcp file "
                "there (copy the whole checkpoint directory again)"
            )
        try:
            size = objects.size(path)
        except OSError:
            raise CorruptCheckpointError(
                f"{path}: data file of item {name!r} is missing; copy the whole checkpoint directory"
            ) from None
        if chunk.offset + chunk.length > size:
            raise CorruptCheckpointError(
                f"{path}: truncated: item {name!r} needs bytes [{chunk.offset}, {chunk.offset + chunk.length}) "
                f"but the file has {size} bytes; the checkpoint was cut short (incomplete copy or save)"
            )

    def _blob(self, chunk: DcpChunk, name: str) -> memoryview:
        """The chunk's stored bytes, read once into an uninitialised buffer (no zero-fill, no slicing copy)."""
        self._check_stored(chunk, name)
        path = self.path / chunk.file
        buf = memoryview(np.empty(chunk.length, dtype=np.uint8))
        try:
            got = objects.read_into(path, chunk.offset, buf)  # parallel ranged reads on a bucket
        except OSError as e:
            raise CorruptCheckpointError(f"{path}: cannot read item {name!r} ({e.strerror or e})") from None
        if got != chunk.length:  # the file shrank since it was checked
            raise CorruptCheckpointError(f"{path}: short read of item {name!r} at byte {chunk.offset} (file changed?)")
        return buf

    def read_chunk(self, name: str, i: int) -> np.ndarray:
        """Chunk `i` of tensor `name` (see `chunks`) as a numpy array."""
        chunk = self.chunks(name)[i]
        blob = self._blob(chunk, name)
        try:
            check_torch_file(MemoryFile(blob))
            tensor = tensor_view(blob)  # the tensor in the read buffer itself
            if tensor is None:  # an archive only torch's own load reads: it copies the bytes out once
                tensor = load_weights_only(MemoryFile(blob))
        except Exception as e:  # torch raises RuntimeError/UnpicklingError/zip errors on garbage
            raise CorruptCheckpointError(
                f"{self.path / chunk.file}: chunk {chunk.offsets} of {name!r} at byte {chunk.offset} "
                f"is not a readable torch.save blob ({type(e).__name__}: {str(e)[:200]})"
            ) from None
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != chunk.sizes:
            found = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise CorruptCheckpointError(
                f"{self.path / chunk.file}: chunk {chunk.offsets} of {name!r} holds {found}, "
                f"expected a tensor of shape {chunk.sizes}"
            )
        return to_numpy(tensor)

    def read(self, name: str, index: Index | None = None) -> np.ndarray:
        """Tensor `name`, or `tensor[index]`, reading only the chunks the index touches."""
        info = self._infos.get(name)
        if info is None:
            raise TensorNotFoundError(self._missing(name))
        sel = _selection(index, info.shape)
        out_shape = tuple(len(range(a, b, s)) for a, b, s, _ in sel)
        touched = []
        for i, chunk in enumerate(self._chunks[name]):
            parts = [_overlap(s, o, o + n) for s, o, n in zip(sel, chunk.offsets, chunk.sizes)]
            if all(p is not None for p in parts):
                touched.append((i, parts))
        # Refuse before allocating the result: coverage is known from the metadata, and each
        # chunk's bytes (at least its elements' worth, see _check_chunk) must be in its file.
        covered = sum(math.prod(p[0].stop - p[0].start for p in parts) for _, parts in touched)
        if covered != math.prod(out_shape):
            raise CorruptCheckpointError(
                f"{self.path}: the chunks of {name!r} cover {covered} of the {math.prod(out_shape)} "
                f"requested elements; the checkpoint is incomplete"
            )
        for i, _ in touched:
            self._check_stored(self._chunks[name][i], name)
        keep = tuple(slice(None) if s[3] else 0 for s in sel)
        if len(touched) == 1 and all(p[0] == slice(0, n) for p, n in zip(touched[0][1], out_shape)):
            # One chunk holds everything asked for (the usual case): a view of it, not a copy into a new array.
            i, parts = touched[0]
            return self.read_chunk(name, i)[tuple(p[1] for p in parts)][keep]
        out = np.empty(out_shape, dtype=info.dtype)
        for i, parts in touched:
            data = self.read_chunk(name, i)
            out[tuple(p[0] for p in parts)] = data[tuple(p[1] for p in parts)]
        return out[keep]

    def read_bytes(self, name: str) -> bytes:
        """The raw stored bytes of a non-tensor item (a `torch.save` blob of the object)."""
        try:
            chunk = self._bytes[name]
        except KeyError:
            raise TensorNotFoundError(self._missing(name)) from None
        return self._blob(chunk, name).tobytes()

    def read_object(self, name: str) -> Any:
        """A non-tensor item loaded with `torch.load(weights_only=True)` (no code runs).

        Objects that need arbitrary classes (a pickled `io.BytesIO`, say) raise
        CorruptCheckpointError; use `read_bytes` to copy those through unchanged.
        """
        try:
            blob = self.read_bytes(name)
            check_torch_file(io.BytesIO(blob))
            return load_weights_only(io.BytesIO(blob))
        except CorruptCheckpointError:
            raise
        except Exception as e:
            raise CorruptCheckpointError(
                f"{self.path}: object {name!r} cannot be loaded safely ({type(e).__name__}: {str(e)[:200]}); "
                "use read_bytes to copy it unchanged"
            ) from None

    def _missing(self, name: str) -> str:
        return (
            f"{self.path}: no item named {name!r} (it has {len(self._chunks)} tensors and {len(self._bytes)} objects)"
        )

    def close(self) -> None:
        """Nothing stays open between reads; here for the TensorReader protocol."""

    def __enter__(self) -> "DcpReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------
# Writing


def _share_part(rank: int) -> str:
    return f".maxckpt-share-{rank}.pkl"


def _dump_synced(path: Path, obj: Any) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _chunk_of(index: Index, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offsets, sizes) of the box a piece index covers; int items cover one element."""
    offsets, sizes = [], []
    for dim, size in enumerate(shape):
        item = index[dim] if dim < len(index) else slice(None)
        if isinstance(item, slice):
            start, stop, step = item.indices(size)
            if step != 1:
                raise ValueError(f"piece index {index}: strided pieces cannot be stored as DCP chunks")
            offsets.append(start)
            sizes.append(max(stop - start, 0))
        else:
            i = int(item) + (size if int(item) < 0 else 0)
            offsets.append(i)
            sizes.append(1)
    return tuple(offsets), tuple(sizes)


class DcpWriter(ClosesOrAborts):
    """Streams tensors into a new DCP directory (implements `TensorWriter`).

    Every tensor chunk is `torch.save`d straight into one data file as it
    arrives, so memory holds one chunk at a time; `close()` writes
    `.metadata` last (via a temporary name), so a directory without it is an
    unfinished write that no loader will take for a checkpoint.

    Keys are stored flat, as DCP stores a flat state dict. Pass `path=` to
    record the nested state-dict path a key came from (e.g.
    `("train_state", "step")` for `train_state.step`), which
    `dcp_to_torch_save` and DCP's key-filtered loads use to rebuild nesting.

    >>> with DcpWriter(out) as w:                                        # doctest: +SKIP
    ...     w.write_pieces("decoder.layers.mlp.linear_fc2.weight", (L, E, F), np.float32,
    ...                    (((i,), layer(i)) for i in range(L)))
    ...     w.write_object("decoder.layers.mlp.linear_fc2._extra_state/shard_0_2", None)
    """

    def __init__(self, path: str | os.PathLike, *, share: Any = None):
        self.path = normalize(path)
        if (self.path / METADATA_FILE).exists():
            from maxckpt.errors import ConversionError

            raise ConversionError(f"{self.path}: already holds a DCP checkpoint; choose an empty output directory")
        self.path.mkdir(parents=True, exist_ok=True)
        # A multi-process conversion (maxckpt.conversion.distributed.Share): each process writes its own
        # `__<rank>_0.distcp` as torch.distributed.checkpoint's ranks do; process 0 merges `.metadata`.
        self.share = share
        self.data_file = DATA_FILE if share is None else f"__{share.rank}_0.distcp"
        self._file = outputs.open_output(self.path / self.data_file)  # streamed to the bucket when the output is one
        # A local file: tensor bytes go straight to the disk (see maxckpt.containers.direct_io).
        self._direct = DirectWrites(self.path / self.data_file, self._file.fileno()) if self._local() else None
        self._items: dict[str, Any] = {}
        self._storage: dict[dcp_md.MetadataIndex, _StorageInfo] = {}
        self._planner: dict[str, tuple[str, ...]] = {}
        self._closed = False

    def _local(self) -> bool:
        return isinstance(self._file, io.BufferedWriter)  # else a streamed upload to a bucket

    def _start(self, name: str) -> None:
        if self._closed:
            raise ValueError(f"{self.path}: writer is closed")
        if name in self._items:
            raise ValueError(f"{self.path}: item {name!r} written twice")

    def _commit(self, name: str, item: Any, storage: dict, path: tuple[str, ...] | None) -> None:
        # Only a completely written item enters the metadata; a failed one leaves dead bytes.
        self._storage.update(storage)
        self._items[name] = item
        self._planner[name] = tuple(path) if path is not None else (name,)

    def _append(self, write: Any) -> tuple[int, int]:
        start = self._file.tell()
        stream = FailSafeStream(self._file, self._direct)  # a full disk is an OSError here, never a C++ abort in torch
        write(stream)
        stream.check()
        length = self._file.tell() - start
        if self._local():  # its fsync at close then has little left
            libc.start_writeback(self._file.fileno(), start, length)
        return start, length

    def _save_chunk(self, tensor: torch.Tensor) -> _StorageInfo:
        # A view of a bigger storage would save the whole storage: keep the blob to the chunk.
        if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size() or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()
        start, length = self._append(lambda f: torch.save(tensor, f))
        return _StorageInfo(self.data_file, start, length)

    def write(self, name: str, array: np.ndarray, *, path: tuple[str, ...] | None = None) -> None:
        """Store a whole tensor as one chunk."""
        array = np.asarray(array)
        self.write_pieces(name, array.shape, array.dtype, [((), array)], path=path)

    def write_pieces(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        pieces: Iterable[tuple[Index, np.ndarray]],
        *,
        path: tuple[str, ...] | None = None,
    ) -> None:
        """Store a tensor given as disjoint pieces that tile it, one DCP chunk per piece.

        A piece index of ints and unit-step slices names the box it fills; an
        int item (a layer of a stacked tensor) is a chunk of size 1 on that axis.
        """
        self._start(name)
        shape = tuple(int(d) for d in shape)
        storage: dict[dcp_md.MetadataIndex, _StorageInfo] = {}
        ttype = to_torch(np.zeros((), dtype=dtype)).dtype
        chunks: list[dcp_md.ChunkStorageMetadata] = []
        boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        for index, array in pieces:
            offsets, sizes = _chunk_of(tuple(index), shape)
            array = np.asarray(array)
            if array.dtype != np.dtype(dtype):
                raise ShapeMismatchError(f"{name}: piece {index} has dtype {array.dtype}, expected {np.dtype(dtype)}")
            if array.size != math.prod(sizes) or any(o + s > d for o, s, d in zip(offsets, sizes, shape)):
                raise ShapeMismatchError(
                    f"{name}: piece {index} has shape {array.shape}, which does not fill the box "
                    f"offsets={offsets} sizes={sizes} of a tensor of shape {shape}"
                )
            for o2, s2 in boxes:
                if all(a < b + m and b < a + n for a, n, b, m in zip(offsets, sizes, o2, s2)):
                    raise ShapeMismatchError(f"{name}: piece {index} overlaps the piece at {o2}")
            boxes.append((offsets, sizes))
            storage[dcp_md.MetadataIndex(name, offsets)] = self._save_chunk(to_torch(array.reshape(sizes)))
            chunks.append(dcp_md.ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
        covered = sum(math.prod(s) for _, s in boxes)
        if covered != math.prod(shape):
            raise ShapeMismatchError(
                f"{name}: pieces cover {covered} of {math.prod(shape)} elements of shape {shape}; "
                "every element must be written exactly once"
            )
        item = dcp_md.TensorStorageMetadata(
            properties=dcp_md.TensorProperties(dtype=ttype), size=torch.Size(shape), chunks=chunks
        )
        self._commit(name, item, storage, path)

    def write_object(self, name: str, obj: Any, *, path: tuple[str, ...] | None = None) -> None:
        """Store a non-tensor item the way DCP does: `torch.save(obj)` as a bytes item."""
        buf = io.BytesIO()
        torch.save(obj, buf)
        self.write_bytes(name, buf.getvalue(), path=path)

    def write_bytes(self, name: str, blob: bytes, *, path: tuple[str, ...] | None = None) -> None:
        """Store an already serialised `torch.save` blob as a bytes item (copying one through)."""
        self._start(name)
        start, length = self._append(lambda f: f.write(blob))
        storage = {dcp_md.MetadataIndex(name): _StorageInfo(self.data_file, start, length)}
        self._commit(name, dcp_md.BytesStorageMetadata(), storage, path)

    def close(self) -> None:
        """Flush the data file and write `.metadata`; the directory is a checkpoint from here on."""
        if self._closed:
            return
        self._closed = True
        self._file.flush()
        if self._direct is not None:
            self._direct.close()
        if self._local():  # an upload is durable once closed
            os.fsync(self._file.fileno())
        self._file.close()
        if self.share is not None:  # this process's part of `.metadata`, merged by process 0 (finish_shares)
            # Beside the data file: in the shared folder, or (a bucket conversion) the bucket, where process 0 reads it.
            part = pickle.dumps((self._items, self._planner, self._storage))
            outputs.write_small(self.path / _share_part(self.share.rank), part)
            return
        self._write_metadata(self._items, self._planner, self._storage)

    def _write_metadata(self, items: dict, planner: dict, storage: dict) -> None:
        md = dcp_md.Metadata(
            state_dict_metadata=items,
            planner_data=planner,
            storage_data=storage,
            storage_meta=dcp_md.StorageMeta(checkpoint_id=str(self.path), save_id=str(uuid.uuid4())),
            version=DCP_VERSION,
        )
        tmp = self.path / f"{METADATA_FILE}.tmp"
        _dump_synced(tmp, md)
        os.replace(tmp, self.path / METADATA_FILE)

    def finish_shares(self, share: Any) -> None:
        """Process 0 of a multi-process conversion, once every process closed its writer: one `.metadata` for all ranks.

        Items keep the single-process order: process 0's non-tensor items, then tensors in write order.
        """
        items: dict[str, Any] = {}
        planner: dict[str, tuple[str, ...]] = {}
        storage: dict[dcp_md.MetadataIndex, _StorageInfo] = {}
        for rank in range(share.size):
            part = self.path / _share_part(rank)
            try:
                r_items, r_planner, r_storage = _MetadataUnpickler(io.BytesIO(outputs.read_small(part))).load()
            except (OSError, pickle.UnpicklingError, EOFError, ValueError) as err:
                from maxckpt.errors import ConversionError

                raise ConversionError(
                    f"{outputs.where(part)}: process {rank}'s part of .metadata is missing or damaged ({err})"
                ) from None
            clash = set(items) & set(r_items)
            if clash:
                raise ValueError(f"{self.path}: item {sorted(clash)[0]!r} written by two processes")
            items.update(r_items)
            planner.update(r_planner)
            storage.update(r_storage)
        order = {info.name: k for k, info in enumerate(share.infos)}
        names = sorted(items, key=lambda n: (n in order, order.get(n, 0)))
        self._write_metadata({n: items[n] for n in names}, {n: planner[n] for n in names}, storage)
        for rank in range(share.size):
            outputs.remove_output(self.path / _share_part(rank))

    def abort(self) -> None:
        """Stop without writing `.metadata` (the directory stays an unfinished write)."""
        if not self._closed:
            self._closed = True
            if self._direct is not None:
                self._direct.close()
            self._file.close()

