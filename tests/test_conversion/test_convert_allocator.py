"""The conversion's allocator tuning stays in `maxckpt convert`: a Python-API caller's process keeps glibc's defaults.

`maxckpt/conversion/allocator.py` raises glibc's mmap threshold so freed tensor
buffers are reused instead of page-faulted afresh. That setting is process-wide
and cannot be undone, so only the CLI (a process that only converts) applies
it; a training process calling `maxckpt.convert()` must still get large blocks
from `mmap` and back to the system on `free` afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

PROBE = Path(__file__).parents[1] / "procs" / "allocator_probe.py"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's mmap threshold exists only on glibc (Linux)",
)


def _run_probe(tmp_path: Path) -> dict:
    src = save_maxtext_run(tmp_path / "run", random_maxtext_params(tiny_spec("llama2")))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(src), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_api_conversion_leaves_large_blocks_to_mmap_and_cli_keeps_them(tmp_path):
    result = _run_probe(tmp_path)
    mib64 = 64 << 20
    # glibc's default, before anything: a 64 MiB block is mmapped and unmapped on free.
    assert result["fresh"]["mmapped"] >= mib64 and result["fresh"]["unmapped_on_free"] >= mib64, result
    # After maxckpt.convert(): still so (it used to leave the threshold at 1 GiB: mmapped 0).
    assert result["after_api"]["mmapped"] >= mib64, result
    assert result["after_api"]["unmapped_on_free"] >= mib64, result
    # `maxckpt convert` keeps its tuning: blocks below the threshold it set come from the heap.
    assert result["cli_threshold"] is not None, result
    assert result["after_cli"]["mmapped"] == 0, result
