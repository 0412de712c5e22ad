"""`torch.save` blobs held in memory, read without copying the tensor out of them.

A DCP data file is a row of complete `torch.save` archives, one per tensor
chunk (see `maxckpt.containers.dcp`). maxckpt reads a chunk's archive into one
buffer; `torch.load` would then copy the tensor's bytes into new memory, a
second full pass over every byte of the checkpoint, into pages the kernel must
first fault in and zero. `torch.save` stores each tensor's storage uncompressed
as one zip record, so the tensor is already in the buffer: `tensor_view` loads
the archive with torch's weights-only loader onto the meta device (shape,
dtype, strides, nothing read), finds the storage record with the standard
library's zip reader and returns a tensor over the buffer's own bytes.

Wherever the archive is not the plain single-storage, native-byte-order kind
`torch.save` writes, `tensor_view` answers None and the caller takes torch's
copying load, which handles every case torch does.
"""

from __future__ import annotations

import io
import struct
import sys
import zipfile
from typing import Any

import torch

from maxckpt.containers.torch_safety import load_weights_only

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, (version .. sizes), name length, extra length
_LOCAL_SIGNATURE = b"PK\x03\x04"


class MemoryFile(io.RawIOBase):
    """A read-only, seekable file over a buffer, without the copy `io.BytesIO` makes of anything but `bytes`.

    zipfile and torch.load read an archive through `readinto`, so nothing copies
    the whole buffer to read it.
    """

    def __init__(self, data: memoryview):
        super().__init__()
        self._data = memoryview(data).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._data)}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), len(self._data) - self._pos))
        view[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n


def tensor_view(blob: memoryview) -> torch.Tensor | None:
    """The tensor a `torch.save` archive in `blob` holds, sharing `blob`'s memory; None if only a copy will do.

    None for: anything but one dense tensor; an archive whose storage is not a
    single uncompressed record of exactly the storage's size; an archive whose
    byte order is not this machine's (torch.load swaps those bytes). Raises what
    `torch.load` raises for an archive that is not a readable weights-only one.
    """
    data = memoryview(blob).cast("B")
    # The archive's layout is checked first: torch 2.13 crashes the process when it
    # loads a foreign-byte-order archive onto the meta device (it swaps a meta storage).
    record = _storage_record(data)
    if record is None:
        return None
    offset, nbytes = record
    meta = load_weights_only(MemoryFile(data), map_location="meta")
    if not isinstance(meta, torch.Tensor) or meta.layout != torch.strided or meta.numel() == 0:
        return None
    if meta.untyped_storage().nbytes() != nbytes or offset % meta.element_size():
        return None
    storage = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)
    # as_strided checks that the shape, strides and offset stay inside the storage.
    return storage.view(meta.dtype).as_strided(meta.shape, meta.stride(), meta.storage_offset())


def _storage_record(data: memoryview) -> tuple[int, int] | None:
    """(start, length) of the archive's one storage record, if it is stored as is in this machine's byte order."""
    try:
        with zipfile.ZipFile(MemoryFile(data)) as archive:
            records = archive.infolist()
            storages = [r for r in records if r.filename.rpartition("/")[0].endswith("/data")]
            byteorder = [r for r in records if r.filename.endswith("/byteorder")]
            if len(storages) != 1 or len(byteorder) != 1 or byteorder[0].file_size > 16:
                return None
            if archive.read(byteorder[0]).decode("ascii", "replace") != sys.byteorder:
                return None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, NotImplementedError):
        return None  # torch's own load says what is wrong with it
    record = storages[0]
    if record.compress_type != zipfile.ZIP_STORED or record.file_size == 0:
        return None
    header = record.header_offset
    if header + _LOCAL_HEADER.size > len(data):
        return None
    signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(data, header)
    start = header + _LOCAL_HEADER.size + name_length + extra_length
    if signature != _LOCAL_SIGNATURE or start + record.file_size > len(data):
        return None
    return start, record.file_size
