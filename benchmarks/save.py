"""Save throughput: maxckpt vs plain Orbax vs the disk itself, on the same bytes.

Measures, in one run and on one state (random bf16, default 1 GiB split into
8 arrays), the raw write of the same bytes with fsync (the physical limit),
a plain Orbax v0 sync save exactly as MaxText calls it, a maxckpt sync save,
and a maxckpt async save (time the training step is blocked, and time until
committed). Prints a table of throughputs and ratios to the raw write, and
writes JSON with `--json`.

    python benchmarks/save.py                      # 1 GiB in a temp dir
    python benchmarks/save.py --size 256MiB --dir /mnt/nvme/bench --json out.json

On a GPU/TPU machine the state lives on the first accelerator, so the async
blocking time shows what device-to-host copies cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from maxckpt import CheckpointManager  # noqa: E402
from maxckpt.units import parse_size  # noqa: E402
from maxckpt.errors import MaxckptError  # noqa: E402

CHUNK = 2 * 1024**3  # MaxText's checkpoint_storage_target_data_file_size_bytes default


def size_arg(text: str) -> int:
    """`--size 1GiB` / `256MiB` / `100MB`, read as `maxckpt convert --max-shard-size` reads sizes."""
    try:
        return parse_size(text)
    except MaxckptError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def make_state(total_bytes: int, arrays: int) -> tuple[dict, list[np.ndarray]]:
    """Random bf16 arrays (incompressible bits) on the first device, plus their host copies."""
    rng = np.random.default_rng(0)
    per = total_bytes // arrays // 2 // 1024 * 1024  # elements per array, a multiple of 1024 rows
    host = [rng.integers(0, 2**16, size=(per // 1024, 1024), dtype=np.uint16).view(ml_dtypes.bfloat16) for _ in range(arrays)]
    device = jax.devices()[0]
    state = {"params": {"params": {f"layer_{i}": {"kernel": jax.device_put(a, device)} for i, a in enumerate(host)}}}
    jax.block_until_ready(state)
    return state, host


def raw_write(folder: Path, host: list[np.ndarray]) -> float:
    """dd-style: the same bytes, one file per array, fsync'd."""
    folder.mkdir(parents=True)
    start = time.perf_counter()
    for i, array in enumerate(host):
        with open(folder / f"array_{i}.bin", "wb") as f:
            f.write(memoryview(array.view(np.uint16)).cast("B"))
            f.flush()
            os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - start


def orbax_sync(folder: Path, state: dict) -> float:
    """Plain Orbax, as MaxText's create_orbax_checkpoint_manager + save_checkpoint call it."""
    mgr = ocp.CheckpointManager(
        folder,
        item_names=("items",),
        item_handlers={"items": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)},
        options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False),
    )
    args = ocp.args.Composite(items=ocp.args.PyTreeSave(
        item=state,
        save_args=jax.tree_util.tree_map(lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK), state),
        ocdbt_target_data_file_size=CHUNK,
    ))
    start = time.perf_counter()
    mgr.save(0, args=args, force=True)
    mgr.wait_until_finished()
    elapsed = time.perf_counter() - start
    mgr.close()
    return elapsed


def maxckpt_sync(folder: Path, state: dict) -> float:
    with CheckpointManager(folder, async_save=False) as mgr:
        start = time.perf_counter()
        mgr.save(0, state)
        mgr.wait()
        return time.perf_counter() - start


def maxckpt_async(folder: Path, state: dict) -> tuple[float, float]:
    """(seconds the caller was blocked, seconds until the checkpoint was committed)."""
    with CheckpointManager(folder, async_save=True) as mgr:
        start = time.perf_counter()
        mgr.save(0, state)
        blocked = time.perf_counter() - start
        mgr.wait()
        return blocked, time.perf_counter() - start


def measure_rounds(
    root: Path, repeats: int, methods: dict[str, Callable[[Path], object]]
) -> tuple[dict[str, list], dict[str, list[float]]]:
    """Run every method once per round, in a fresh (seeded) random order each round, so neither
    drift in the disk nor what ran just before favours one of them."""
    results: dict[str, list] = {name: [] for name in methods}
    cpu_results: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for i in range(repeats):
        for name in random.Random(i).sample(names, len(names)):
            fn = methods[name]
            folder = root / f"{i}_{len(results[name])}_{time.monotonic_ns()}"
            os.sync()  # start clean: no method pays for the previous one's dirty pages
            try:
                cpu = time.process_time()
                wall = fn(folder)
                cpu_results[name].append(time.process_time() - cpu)  # all threads of this process
                results[name].append(wall)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    return results, cpu_results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=size_arg, default=parse_size("1GiB"), help="state size (default 1GiB)")
    parser.add_argument("--arrays", type=int, default=8, help="number of arrays the state is split into")
    parser.add_argument("--repeats", type=int, default=4, help="runs per method; the median is reported")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    console = Console()
    root = Path(tempfile.mkdtemp(prefix="maxckpt_bench_", dir=args.dir))
    try:
        state, host = make_state(args.size, args.arrays)
        nbytes = sum(a.nbytes for a in host)
        console.print(f"state: {nbytes / 1024**3:.2f} GiB bf16 in {args.arrays} arrays on {jax.devices()[0]}; writing to {root}")
        runs, cpu = measure_rounds(root, args.repeats, {
            "raw": lambda f: raw_write(f, host),
            "plain": lambda f: orbax_sync(f, state),
            "sync": lambda f: maxckpt_sync(f, state),
            "async": lambda f: maxckpt_async(f, state),
        })
        raw, plain, sync = (statistics.median(runs[k]) for k in ("raw", "plain", "sync"))
        blocked = statistics.median(r[0] for r in runs["async"])
        total = statistics.median(r[1] for r in runs["async"])
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in cpu.items()}
    rows = [
        ("raw write + fsync (physical limit)", raw, med["raw"]),
        ("plain Orbax sync save (MaxText's call)", plain, med["plain"]),
        ("maxckpt sync save", sync, med["sync"]),
        ("maxckpt async save: blocking", blocked, None),
        ("maxckpt async save: until committed", total, med["async"]),
    ]
    table = Table(title=f"save {nbytes / 1024**3:.2f} GiB (median of {args.repeats})", title_justify="left")
    table.add_column("method")
    table.add_column("seconds", justify="right")
    table.add_column("GiB/s", justify="right")
    table.add_column("vs raw", justify="right")
    table.add_column("vs plain Orbax", justify="right")
    table.add_column("CPU s", justify="right")
    results = []
    for name, seconds, cpu_s in rows:
        gibs = nbytes / 1024**3 / seconds
        results.append({"method": name, "seconds": seconds, "gib_per_s": gibs, "cpu_seconds": cpu_s,
                        "time_vs_raw": seconds / raw, "time_vs_plain_orbax": seconds / plain})
        table.add_row(name, f"{seconds:.3f}", f"{gibs:.2f}", f"{seconds / raw:.2f}x", f"{seconds / plain:.2f}x",
                      "" if cpu_s is None else f"{cpu_s:.2f}")
    console.print(table)
    paired = [m / p for m, p in zip(runs["sync"], runs["plain"])]
    console.print(
        f"maxckpt sync / plain Orbax, paired per round: median {statistics.median(paired):.2f}x "
        f"(min {min(paired):.2f}x, max {max(paired):.2f}x)"
    )
    console.print("[dim]'vs' columns are wall-time ratios: below 1.00x is faster. CPU s is this process's CPU time "
                  "(all threads), a steadier signal than wall time on a shared disk. The raw write is fsync'd; dirty "
                  "pages are flushed (os.sync) before each method, the page cache is not dropped.[/]")
    report = {
        "size_bytes": nbytes,
        "arrays": args.arrays,
        "dtype": "bfloat16",
        "repeats": args.repeats,
        "device": str(jax.devices()[0]),
        "platform": platform.platform(),
        "versions": {"jax": jax.__version__, "orbax-checkpoint": ocp.__version__},
        "results": results,
        "samples_seconds": {
            "raw": runs["raw"], "plain_orbax_sync": runs["plain"], "maxckpt_sync": runs["sync"],
            "maxckpt_async_blocking": [r[0] for r in runs["async"]],
            "maxckpt_async_total": [r[1] for r in runs["async"]],
        },
        "maxckpt_sync_over_plain_orbax_paired": paired,
        "cpu_samples_seconds": cpu,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        console.print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
