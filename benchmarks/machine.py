"""What this machine charges for fresh memory, printed beside every benchmark table.

Why: most of a conversion's or a restore's kernel time is page faults -
every fresh buffer and every new page-cache page is mapped and zeroed by the
kernel, 4 KiB at a time. What one fault costs depends on the machine far
more than on maxckpt. On the 2-core development VM (Firecracker, nested
virtualization, free page reporting to the host) a fault costs about 3 us,
and memory the guest had handed back to the host costs up to 3x more on its
next use, so the same 3 GiB raw write+fsync took 2.3 s right after a process
had touched 4 GiB and 9 s after ten idle seconds. Runs of the same
conversion then differ by 2x, and the floors and maxckpt pay different
shares. Printing the probe beside a table tells its reader how much of the
table is the machine: where it is several tenths of a second per GiB,
kernel time dominates and the ratios say more about the host than about
the software.

    python benchmarks/machine.py
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time

import numpy as np

PAGE = 4096


def _touch_fresh(nbytes: int) -> float:
    """Seconds to fault in `nbytes` of a new anonymous mapping, one write per 4 KiB page.

    A plain mmap gets no transparent huge pages unless the system enables
    them for every mapping, so this is the 4 KiB path that TensorStore's
    buffers and the page cache take.
    """
    region = mmap.mmap(-1, nbytes)
    try:
        pages = np.frombuffer(region, np.uint8)
        start = time.perf_counter()
        pages[::PAGE] = 1
        seconds = time.perf_counter() - start
        del pages
    finally:
        region.close()
    return seconds


def fresh_memory_cost(nbytes: int = 256 << 20) -> dict[str, float]:
    """Seconds per GiB to fault in fresh 4 KiB pages: first in this probe, then again at once.

    The first pass gets whatever the kernel has free (on a VM with free page
    reporting, often pages the host has taken back); the second reuses the
    pages the first just freed, so it is the plain cost of a fault and a zeroed page.
    """
    per_gib = (1 << 30) / nbytes
    first = _touch_fresh(nbytes) * per_gib
    again = _touch_fresh(nbytes) * per_gib
    return {"fresh_pages_first_s_per_gib": round(first, 3), "fresh_pages_again_s_per_gib": round(again, 3)}


def describe(cost: dict[str, float]) -> str:
    """One line for under a table."""
    return (
        f"Machine: faulting in fresh 4 KiB pages took {cost['fresh_pages_first_s_per_gib']:.2f} s/GiB "
        f"(then {cost['fresh_pages_again_s_per_gib']:.2f} s/GiB for pages just freed); kernel time in this "
        "table grows with it (see benchmarks/machine.py)"
    )


def installed_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a benchmarked process that imports maxckpt as an installed package does: from bytecode.

    pip compiles a package's modules when it installs it (MaxText's venv has
    its .pyc files), but a source checkout run with PYTHONDONTWRITEBYTECODE=1
    (as this machine's shells are) parses every module on every start: about
    0.3 s of CPU per maxckpt process on the 2-core VM, counted against maxckpt
    alone. The bytecode goes to a cache of its own (PYTHONPYCACHEPREFIX), so
    the checkout is left as it is.
    """
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "maxckpt-bench-pycache")
    return out


if __name__ == "__main__":
    print(describe(fresh_memory_cost()))
