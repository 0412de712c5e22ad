"""Which restores read local files through mmap, and how many chunk copies each runs at once.

Why: mapped reads copy each byte once instead of twice, but move the wait for the disk onto TensorStore's copy
threads, so an uncompressed checkpoint is restored with more copies in flight; a compressed one keeps
TensorStore's default (each copy also decodes into a chunk-sized buffer). The patch of Orbax that does the
reading is :mod:`maxckpt.compat.orbax_mapped_reads`; measurements in docs/design/mapped-reads.md.
"""

from __future__ import annotations

import contextlib
import os

from maxckpt.compat.orbax_mapped_reads import can_map, mapped_reads
from maxckpt.containers.orbax_codecs import stores_compressed_chunks

# Copies in flight for an uncompressed checkpoint (docs/design/mapped-reads.md: 16 ran a cold restore at 0.74-0.81x
# of a parallel raw read on 2 cores, 2 at 0.50x).
UNCOMPRESSED_COPIES_IN_FLIGHT = 16


def copies_in_flight(items_dir: str | os.PathLike) -> int | None:
    """How many chunk copies a mapped restore of `items_dir` may run at once.

    None: TensorStore's default (a thread per core), for a compressed checkpoint or one that cannot be told.
    """
    if stores_compressed_chunks(items_dir) is not False:
        return None
    return max(UNCOMPRESSED_COPIES_IN_FLIGHT, os.cpu_count() or 1)


def mapped_file_reads(items_dir: str | os.PathLike) -> contextlib.AbstractContextManager[bool]:
    """Within this block Orbax restores of `items_dir` read local files through mmap; yields whether they do.

    Nothing changes for a bucket, a folder whose files cannot be mapped, or an Orbax without the expected factory.
    """
    if not can_map(items_dir):
        return contextlib.nullcontext(False)
    return mapped_reads(copies_in_flight(items_dir))
