"""Whether an Orbax checkpoint stores any array's chunks compressed.

Why a reader cares: decoding a compressed chunk needs a buffer of the whole
decoded chunk (MaxText writes zstd chunks of up to 2 GiB), so the number of
chunks decoded at once is a memory decision. Uncompressed chunks read through
mmap are copied from the mapped pages into their destination and need no
such buffer, so more of them can be in flight at once (see
maxckpt.manager.mapped_reads).

The answer comes from each array's own zarr metadata (`zarr.json`, or
`.zarray` for zarr v2), read from the checkpoint's OCDBT database or its
per-array folders: an Orbax save applies one codec choice to every array,
but a checkpoint merged or edited by other tools need not, so all are read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import tensorstore as ts

from maxckpt.containers.orbax_items import uses_ocdbt
from maxckpt.storage.kvstore import kvstore_spec

_METADATA_KEYS = (b"zarr.json", b".zarray")
# zarr v3 codecs that only arrange or check bytes: a chunk stored with nothing else is its raw bytes.
_PLAIN_CODECS = {"bytes", "transpose", "crc32c", "sharding_indexed"}


def _codec_names(codecs: Any) -> Iterator[str]:
    """Every codec name in a zarr v3 codec list, nested ones (inside `sharding_indexed`) included."""
    for codec in codecs or ():
        if isinstance(codec, str):
            yield codec
            continue
        yield codec.get("name", "")
        config = codec.get("configuration") or {}
        yield from _codec_names(config.get("codecs"))
        yield from _codec_names(config.get("index_codecs"))


def is_compressed(array_metadata: dict[str, Any]) -> bool:
    """Whether one array's zarr metadata (v3 `zarr.json` or v2 `.zarray`) has its chunks compressed or filtered."""
    if "codecs" in array_metadata or array_metadata.get("zarr_format") == 3:
        return any(name not in _PLAIN_CODECS for name in _codec_names(array_metadata.get("codecs")))
    return array_metadata.get("compressor") is not None or bool(array_metadata.get("filters"))


def _kvstore(items_dir: str | os.PathLike) -> dict[str, Any]:
    base = kvstore_spec(items_dir)
    if uses_ocdbt(items_dir):
        return {"driver": "ocdbt", "base": base}
    return base


def stores_compressed_chunks(items_dir: str | os.PathLike) -> bool | None:
    """True if any array of the local checkpoint in `items_dir` is stored compressed; None if that cannot be told.

    None covers a folder without readable array metadata, which callers
    treat as compressed (the cautious answer).
    """
    try:
        store = ts.KvStore.open(_kvstore(items_dir)).result()
        keys = [key for key in store.list().result() if key.endswith(_METADATA_KEYS)]
        reads = [store.read(key) for key in keys]
        metadata = [json.loads(read.result().value) for read in reads]
    except (ValueError, OSError, json.JSONDecodeError):
        return None
    if not metadata:
        return None
    return any(is_compressed(array) for array in metadata)
