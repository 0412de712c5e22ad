"""`maxckpt verify --integrity`: re-read a checkpoint and check every tensor against its manifest.

Without a manifest, what the format itself allows (metadata, DCP chunk offsets within their files, every chunk
decodes). It opens checkpoints, so it lives with conversion, above the manifest mechanics of
:mod:`maxckpt.integrity`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from maxckpt.errors import CorruptCheckpointError
from maxckpt.integrity import ALGORITHM, check_entry, dtype_name, first_line, hash_read, load_manifest, manifest_path


@dataclass
class IntegrityRow:
    name: str
    dtype: str
    shape: tuple[int, ...]
    ok: bool
    problem: str = ""


@dataclass
class IntegrityReport:
    path: Any
    format: str
    manifest: Any  # its path, or None when the checkpoint has none
    rows: list[IntegrityRow] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)  # what was checked, in words

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def failures(self) -> list[IntegrityRow]:
        return [r for r in self.rows if not r.ok]

    def table(self, only_failures: bool = False):
        from rich.markup import escape
        from rich.table import Table

        title = f"{self.path} ({self.format}): " + (f"manifest {self.manifest}" if self.manifest else "no manifest")
        table = Table(title=escape(title), title_justify="left")
        for col in ("tensor", "dtype", "shape", ""):
            table.add_column(col)
        for r in self.rows:
            if only_failures and r.ok:
                continue
            table.add_row(
                escape(r.name), r.dtype, str(r.shape), "[green]ok[/]" if r.ok else f"[red]{escape(r.problem)}[/]"
            )
        return table


def _dcp_chunks_problem(reader: Any, name: str, sizes: dict[str, int | None]) -> str | None:
    """For a DCP checkpoint: a chunk of `name` that lies past the end of its data file (or whose file is gone)."""
    from maxckpt.storage import objects

    for chunk in reader.chunks(name):
        if chunk.file not in sizes:
            try:
                sizes[chunk.file] = objects.size(reader.path / chunk.file)
            except OSError:
                sizes[chunk.file] = None
        size = sizes[chunk.file]
        if size is None:
            return f"its data file {chunk.file} is missing"
        if chunk.offset + chunk.length > size:
            return (f"its chunk at {list(chunk.offsets)} ends at byte {chunk.offset + chunk.length} of {chunk.file}, "
                    f"which has {size} bytes (truncated file?)")
    return None


def check_integrity(path: str | os.PathLike, *, step: int | None = None, format: str | None = None) -> IntegrityReport:
    """Re-read every tensor of the checkpoint at `path` and check it against its manifest.

    Without a manifest, what the format itself allows: opening it validates
    its metadata (safetensors headers and their offsets within the files,
    DCP `.metadata` against the data files' sizes, Orbax/OCDBT/zarr
    metadata, torch archives' records), and every tensor is read whole, so
    every chunk decodes.
    """
    from maxckpt.conversion.checkpoint import open_checkpoint
    from maxckpt.errors import MaxckptError

    with open_checkpoint(path, format=format, step=step) as ckpt:
        where = manifest_path(ckpt)
        entries = load_manifest(where)
        infos = ckpt.tensors()
        report = IntegrityReport(ckpt.path, ckpt.format.name, where if entries is not None else None)
        report.checks.append(f"{ckpt.format.name} metadata read ({len(infos)} tensors)")
        dcp = hasattr(ckpt.reader, "chunks") and ckpt.format.name in ("megatron", "torchtitan")
        if dcp:
            report.checks.append("every DCP chunk lies inside its data file")
        file_sizes: dict[str, int | None] = {}
        for name, info in infos.items():
            row = IntegrityRow(name, dtype_name(info.dtype), tuple(info.shape), True)
            report.rows.append(row)
            try:
                problem = _dcp_chunks_problem(ckpt.reader, name, file_sizes) if dcp else None
                if problem is not None:
                    row.ok, row.problem = False, problem
                elif entries is None:
                    box = tuple((0, int(d)) for d in info.shape)
                    hash_read(ckpt.reader, name, box, np.dtype(info.dtype).itemsize)  # every chunk decodes
                elif name not in entries:
                    row.ok, row.problem = False, "not in the manifest (added after it was written)"
                else:
                    check_entry(ckpt.reader, info, name, entries[name], ckpt.path)
            except CorruptCheckpointError as err:
                row.ok, row.problem = False, str(err).split(f"tensor {name}: ", 1)[-1]
            except (MaxckptError, OSError, ValueError, RuntimeError) as err:
                row.ok, row.problem = False, f"unreadable: {first_line(err)}"
        if entries is not None:
            for name, entry in entries.items():
                if name not in infos:
                    report.rows.append(
                        IntegrityRow(
                            name,
                            str(entry.get("dtype")),
                            tuple(entry.get("shape", ())),
                            False,
                            "in the manifest but missing",
                        )
                    )
            report.checks.append(f"every tensor re-read and its {ALGORITHM} compared with the manifest")
        else:
            report.checks.append(
                "every tensor read whole (every chunk decodes); no manifest, so values cannot be checked"
            )
    return report
