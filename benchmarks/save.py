"""Saves and restores: maxckpt against the disk itself, on the same bytes, in one run.

Every round writes and reads one state (default 1 GiB of bf16, split into 8
arrays, values like trained weights: normal(0, 0.02)) with:

  save     raw write + fsync of the same bytes (the floor), plain Orbax exactly
           as MaxText calls it (zstd), maxckpt's synchronous save, and maxckpt's
           async save (time the training loop is blocked, time to commit);
  restore  raw read of the raw files, and maxckpt's restore (CheckpointManager
           .restore onto an abstract target, arrays on the first device) of the
           checkpoint its sync save wrote, each cold (the files' pages evicted
           from the page cache with posix_fadvise DONTNEED, checked with
           fincore when it exists) and warm (read again at once).

The order of methods is shuffled (seeded) every round; medians over rounds
are reported, with the goals of issue 13 against issue 27's floors that count
the CPU (max(raw wall, raw CPU / cores) of the better raw method): sync save
>= 0.9x the raw write's throughput, cold restore >= 0.9x the cold raw read's
(into freshly allocated arrays), async blocking <= 2% of a sync save; each
goal also carries its value against the old floor (the raw wall time alone).
Prints tables, writes JSON with `--json`, and what this machine charges to
fault in fresh memory (benchmarks/machine.py; JSON "machine"): restores are
mostly that, so it says how much of the table is the host.

    python benchmarks/save.py                          # 1 GiB bf16 in a temp dir
    python benchmarks/save.py --size 2GiB --dtype float32 --dir /mnt/nvme/bench --json out.json

On a GPU/TPU machine the state lives on the first accelerator, so the async
blocking time includes the device-to-host copy and the restore the copy back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import machine  # benchmarks/machine.py, beside this script

from maxckpt import CheckpointConfig, CheckpointManager  # noqa: E402
from maxckpt.errors import MaxckptError  # noqa: E402
from maxckpt.units import parse_size  # noqa: E402

CHUNK = 2 * 1024**3  # MaxText's checkpoint_storage_target_data_file_size_bytes default
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
GOALS = {"sync_save_vs_raw_write": 0.9, "restore_vs_raw_read": 0.9, "async_blocking_vs_sync_save": 0.02}


def size_arg(text: str) -> int:
    """`--size 1GiB` / `256MiB` / `100MB`, read as `maxckpt convert --max-shard-size` reads sizes."""
    try:
        return parse_size(text)
    except MaxckptError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def make_state(total_bytes: int, arrays: int, dtype: Any) -> tuple[dict, list[np.ndarray]]:
    """Arrays of normal(0, 0.02) values (as compressible as trained weights) on the first device."""
    rng = np.random.default_rng(0)
    itemsize = np.dtype(dtype).itemsize
    rows = max(1, total_bytes // arrays // itemsize // 1024)
    arrays_ = [(rng.standard_normal((rows, 1024), dtype=np.float32) * 0.02).astype(dtype) for _ in range(arrays)]
    host_state = {"params": {"params": {f"layer_{i}": {"kernel": a} for i, a in enumerate(arrays_)}}}
    state = jax.device_put(host_state, jax.devices()[0])
    jax.block_until_ready(state)
    return state, jax.tree_util.tree_leaves(host_state)  # host copies in the state's leaf order


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def evict(folder: Path) -> None:
    """Drop the folder's pages from the page cache (flushed first: dirty pages cannot be dropped)."""
    os.sync()
    for path in _files(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(folder: Path) -> int | None:
    """Bytes of the folder's files in the page cache (util-linux fincore), None without fincore."""
    files = [str(p) for p in _files(folder)]
    if not files or shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", *files],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None
    return sum(int(x) for x in out.stdout.split())


# --- saves -------------------------------------------------------------------------------------


def raw_write(folder: Path, host: list[np.ndarray], threads: int = 1) -> float:
    """dd-style: the same bytes, one file per array, each fsync'd, then the folder.

    With `threads` > 1 the files are written and fsync'd concurrently, as
    TensorStore writes OCDBT data files: on many disks (and VMs) that is
    faster, and the faster of the two is the floor.
    """
    folder.mkdir(parents=True)

    def one(i: int) -> None:
        with open(folder / f"array_{i}.bin", "wb") as f:
            f.write(memoryview(np.ascontiguousarray(host[i]).view(np.uint8)).cast("B"))
            f.flush()
            os.fsync(f.fileno())

    start = time.perf_counter()
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(len(host))))
    else:
        for i in range(len(host)):
            one(i)
    _fsync_dir(folder)
    return time.perf_counter() - start


def orbax_sync(folder: Path, state: dict) -> float:
    """Plain Orbax, as MaxText's create_orbax_checkpoint_manager + save_checkpoint call it (zstd on)."""
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


def maxckpt_sync(folder: Path, state: dict, config: CheckpointConfig | None = None) -> float:
    with CheckpointManager(folder, async_save=False, config=config) as mgr:
        start = time.perf_counter()
        mgr.save(0, state)
        mgr.wait()
        return time.perf_counter() - start


def maxckpt_async(folder: Path, state: dict, config: CheckpointConfig | None = None) -> tuple[float, float]:
    """(seconds the caller was blocked, seconds until the checkpoint was committed)."""
    with CheckpointManager(folder, async_save=True, config=config) as mgr:
        start = time.perf_counter()
        mgr.save(0, state)
        blocked = time.perf_counter() - start
        mgr.wait()
        return blocked, time.perf_counter() - start


# --- restores ----------------------------------------------------------------------------------


def raw_read(folder: Path, threads: int = 1) -> tuple[float, list[np.ndarray]]:
    """Read every raw file into a fresh buffer, unbuffered; concurrently with `threads` > 1."""

    def one(path: Path) -> np.ndarray:
        buf = np.empty(path.stat().st_size, np.uint8)
        with open(path, "rb", buffering=0) as f:
            view, got = memoryview(buf), 0
            while got < buf.nbytes:
                n = f.readinto(view[got:])
                if not n:
                    raise OSError(f"short read of {path}")
                got += n
        return buf

    files = _files(folder)
    start = time.perf_counter()
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            out = list(pool.map(one, files))
    else:
        out = [one(p) for p in files]
    return time.perf_counter() - start, out


def maxckpt_restore(folder: Path, target: Any, config: CheckpointConfig | None = None) -> tuple[float, Any]:
    """CheckpointManager.restore of the newest step onto `target`, until the arrays are ready."""
    with CheckpointManager(folder, async_save=False, config=config) as mgr:
        start = time.perf_counter()
        restored = mgr.restore(target)
        jax.block_until_ready(restored)
        return time.perf_counter() - start, restored


# --- the run -----------------------------------------------------------------------------------


def _warm_up(root: Path) -> None:
    """One tiny save and restore, so no measured method pays for first-use setup (imports, pools)."""
    tiny = {"params": {"w": jax.device_put(np.ones((8, 8), np.float32), jax.devices()[0])}}
    folder = root / "warm_up"
    maxckpt_sync(folder, tiny)
    maxckpt_restore(folder, _abstract(tiny))
    shutil.rmtree(folder, ignore_errors=True)


def _abstract(state: dict) -> Any:
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in _files(folder))


def run_rounds(root: Path, repeats: int, state: dict, host: list[np.ndarray], config: CheckpointConfig) -> dict[str, Any]:
    """Each round: the saves in a shuffled order, then the reads (each cold, then warm) likewise."""
    target = _abstract(state)
    host_tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), host)
    threads = min(len(host), 8)
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    evicted_left: list[int] = []
    disk: dict[str, int] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        c0 = time.process_time()
        result = fn()
        cpu.setdefault(name, []).append(time.process_time() - c0)  # all threads of this process
        return result

    def record(name: str, fn: Callable[[], float]) -> None:
        wall.setdefault(name, []).append(timed(name, fn))

    def record_async(folder: Path) -> None:
        blocked, total = timed("maxckpt_async", lambda: maxckpt_async(folder, state, config))
        wall.setdefault("maxckpt_async_blocking", []).append(blocked)
        wall.setdefault("maxckpt_async_total", []).append(total)

    for i in range(repeats):
        folders = {name: root / f"r{i}_{name}" for name in ("raw", "raw_par", "plain", "sync", "async")}
        saves: dict[str, Callable[[], None]] = {
            "raw_write": lambda: record("raw_write", lambda: raw_write(folders["raw"], host)),
            "raw_write_par": lambda: record("raw_write_par", lambda: raw_write(folders["raw_par"], host, threads)),
            "plain_orbax_sync": lambda: record("plain_orbax_sync", lambda: orbax_sync(folders["plain"], state)),
            "maxckpt_sync": lambda: record("maxckpt_sync", lambda: maxckpt_sync(folders["sync"], state, config)),
            "maxckpt_async": lambda: record_async(folders["async"]),
        }
        try:
            for name in random.Random(i).sample(list(saves), len(saves)):
                os.sync()  # start clean: no method pays for the previous one's dirty pages
                saves[name]()
            if i == 0:
                disk = {"raw": _disk_bytes(folders["raw"]), "plain_orbax": _disk_bytes(folders["plain"]),
                        "maxckpt": _disk_bytes(folders["sync"])}
            for name in ("plain", "async", "raw_par"):
                shutil.rmtree(folders[name])

            def read_raw(kind: str, n: int) -> None:
                key = f"raw_read_{kind}" + ("_par" if n > 1 else "")
                record(key, lambda: raw_read(folders["raw"], n)[0])

            def read_maxckpt(kind: str) -> None:
                seconds, restored = timed(f"maxckpt_restore_{kind}", lambda: maxckpt_restore(folders["sync"], target, config))
                wall.setdefault(f"maxckpt_restore_{kind}", []).append(seconds)
                if i == 0 and kind == "cold":  # what was timed restored the right bytes
                    for got, want in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(host_tree)):
                        if not np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8)):
                            raise AssertionError("maxckpt restored different bytes than it saved")

            reads: dict[str, tuple[Path, Callable[[str], None]]] = {
                "raw": (folders["raw"], lambda kind: read_raw(kind, 1)),
                "raw_par": (folders["raw"], lambda kind: read_raw(kind, threads)),
                "maxckpt": (folders["sync"], read_maxckpt),
            }
            for name in random.Random(1000 + i).sample(list(reads), len(reads)):
                folder, read = reads[name]
                evict(folder)
                left = resident_bytes(folder)
                if left is not None:
                    evicted_left.append(left)
                read("cold")
                read("warm")
        finally:
            for folder in folders.values():
                shutil.rmtree(folder, ignore_errors=True)
    return {"wall": wall, "cpu": cpu, "resident_after_evict": evicted_left, "disk_bytes": disk}


FLOORS = {  # floor name -> the raw methods it is the faster of
    "write": ("raw_write", "raw_write_par"),
    "read_cold": ("raw_read_cold", "raw_read_cold_par"),
    "read_warm": ("raw_read_warm", "raw_read_warm_par"),
}
ROWS = (  # (key, label, floor)
    ("raw_write", "raw write + fsync, 1 thread", None),
    ("raw_write_par", "raw write + fsync, a thread per file", None),
    ("plain_orbax_sync", "plain Orbax sync save (MaxText's call, zstd)", "write"),
    ("maxckpt_sync", "maxckpt sync save", "write"),
    ("maxckpt_async_blocking", "maxckpt async save: blocking", None),
    ("maxckpt_async_total", "maxckpt async save: until committed", "write"),
    ("raw_read_cold", "raw read, cold, 1 thread", None),
    ("raw_read_cold_par", "raw read, cold, a thread per file", None),
    ("maxckpt_restore_cold", "maxckpt restore, cold", "read_cold"),
    ("raw_read_warm", "raw read, warm (page cache), 1 thread", None),
    ("raw_read_warm_par", "raw read, warm, a thread per file", None),
    ("maxckpt_restore_warm", "maxckpt restore, warm", "read_warm"),
)
CPU_KEY = {"maxckpt_async_blocking": None, "maxckpt_async_total": "maxckpt_async"}


def cpu_floor(wall: dict[str, float], cpu: dict[str, float], keys: tuple[str, ...], cores: int) -> float:
    """The floor that counts the CPU: the best raw method's max(wall, CPU / cores).

    A save has only its write (on CPU there is no device copy), a restore only
    its read, so the issue's max(read wall, write wall, (read CPU + write CPU)
    / cores) is max(wall, CPU / cores) of the raw method; of the 1-thread and
    the thread-per-file raw method the lower counts.
    """
    return min(max(wall[k], cpu[k] / cores) for k in keys)


def _config(pairs: list[str]) -> CheckpointConfig:
    """The manager's config: defaults plus `--set key=value` pairs, validated like an overlay's."""
    changes = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"error: --set {pair!r} is not of the form key=value")
        changes[key.strip()] = value.strip()
    try:
        return CheckpointConfig().with_overrides(**changes)
    except MaxckptError as err:
        raise SystemExit(f"error: {err}") from None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=size_arg, default=parse_size("1GiB"), help="state size (default 1GiB)")
    parser.add_argument("--arrays", type=int, default=8, help="number of arrays the state is split into")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="dtype of the arrays")
    parser.add_argument("--repeats", type=int, default=4, help="rounds; medians are reported")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config key for maxckpt's manager (e.g. maxckpt_storage_compression=true); repeatable")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    config = _config(args.overrides)

    console = Console(width=max(Console().width, 132))
    root = Path(tempfile.mkdtemp(prefix="maxckpt_bench_", dir=args.dir))
    try:
        state, host = make_state(args.size, args.arrays, DTYPES[args.dtype])
        nbytes = sum(a.nbytes for a in host)
        console.print(f"state: {nbytes / 1024**3:.2f} GiB {args.dtype} in {args.arrays} arrays on "
                      f"{jax.devices()[0]}; {os.cpu_count()} CPUs; writing to {root}"
                      + (f"; manager config: {', '.join(args.overrides)}" if args.overrides else ""))
        _warm_up(root)
        runs = run_rounds(root, args.repeats, state, host, config)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    wall, cpu = runs["wall"], runs["cpu"]
    med = {k: statistics.median(v) for k, v in wall.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    cores = os.cpu_count() or 1
    floor_old = {name: min(med[k] for k in keys) for name, keys in FLOORS.items()}
    floor = {name: cpu_floor(med, cpu_med, keys, cores) for name, keys in FLOORS.items()}
    floor_rounds = {
        name: [cpu_floor(dict(zip(keys, ws)), dict(zip(keys, cs)), keys, cores)
               for ws, cs in zip(zip(*(wall[k] for k in keys)), zip(*(cpu[k] for k in keys)))]
        for name, keys in FLOORS.items()
    }
    table = Table(title=f"save and restore {nbytes / 1024**3:.2f} GiB {args.dtype} (median of {args.repeats})",
                  title_justify="left")
    for col, just in (("method", "left"), ("seconds", "right"), ("GiB/s", "right"),
                      ("throughput vs floor", "right"), ("CPU s", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    results = []
    for key, label, floor_name in ROWS:
        seconds = med[key]
        gibs = nbytes / 1024**3 / seconds
        vs_floor = floor[floor_name] / seconds if floor_name else None
        cpu_key = CPU_KEY.get(key, key)
        cpu_s = cpu_med.get(cpu_key) if cpu_key else None
        is_floor = any(key in FLOORS[f] and floor[f] == max(med[key], cpu_med[key] / cores) for f in FLOORS)
        results.append({"method": label, "key": key, "seconds": seconds, "gib_per_s": gibs,
                        "throughput_vs_floor": vs_floor, "floor": floor_name, "is_floor": is_floor, "cpu_seconds": cpu_s})
        table.add_row(label + (" [b](floor)[/]" if is_floor else ""), f"{seconds:.3f}", f"{gibs:.2f}",
                      "" if vs_floor is None else f"{vs_floor:.2f}x", "" if cpu_s is None else f"{cpu_s:.2f}")
        if key in ("maxckpt_async_total", "maxckpt_restore_cold"):
            table.add_section()
    console.print(table)

    measured = {
        "sync_save_vs_raw_write": floor["write"] / med["maxckpt_sync"],
        "restore_vs_raw_read": floor["read_cold"] / med["maxckpt_restore_cold"],
        "async_blocking_vs_sync_save": med["maxckpt_async_blocking"] / med["maxckpt_sync"],
    }
    measured_old = {  # against issue 13's floor: the faster raw method's wall time alone
        "sync_save_vs_raw_write": floor_old["write"] / med["maxckpt_sync"],
        "restore_vs_raw_read": floor_old["read_cold"] / med["maxckpt_restore_cold"],
        "async_blocking_vs_sync_save": measured["async_blocking_vs_sync_save"],
    }
    per_round = {
        "sync_save_vs_raw_write": [f / x for f, x in zip(floor_rounds["write"], wall["maxckpt_sync"])],
        "restore_vs_raw_read": [f / x for f, x in zip(floor_rounds["read_cold"], wall["maxckpt_restore_cold"])],
        "async_blocking_vs_sync_save": [b / x for b, x in zip(wall["maxckpt_async_blocking"], wall["maxckpt_sync"])],
    }
    goals = []
    goal_table = Table(title="goals (issue 13)", title_justify="left")
    for col in ("goal", "measured (medians)", "per round (min..max)", "target", "met"):
        goal_table.add_column(col)
    for name, target in GOALS.items():
        value, rounds = measured[name], per_round[name]
        lower_is_better = name.startswith("async")
        met = value <= target if lower_is_better else value >= target
        goals.append({"goal": name, "measured": value, "per_round": rounds, "target": target, "met": met,
                      "measured_old_floor": measured_old[name]})
        fmt = (lambda v: f"{v * 100:.2f}%") if lower_is_better else (lambda v: f"{v:.2f}x")
        goal_table.add_row(name, fmt(value), f"{fmt(min(rounds))}..{fmt(max(rounds))}",
                           ("<= " if lower_is_better else ">= ") + fmt(target),
                           "[green]yes[/]" if met else "[red]no[/]")
    console.print(goal_table)
    disk = runs["disk_bytes"]
    left = runs["resident_after_evict"]
    console.print(
        f"on disk: raw {disk['raw'] / 2**20:.0f} MiB, plain Orbax (zstd) {disk['plain_orbax'] / 2**20:.0f} MiB, "
        f"maxckpt {disk['maxckpt'] / 2**20:.0f} MiB. Page cache left after eviction: "
        + (f"at most {max(left) / 2**20:.1f} MiB (fincore)" if left else "not checked (no fincore)")
    )
    console.print(f"[dim]Floor = the lower max(wall, CPU / {cores} cores) of the two raw methods (1 thread or a thread "
                  "per file): its CPU counted as issue 27 asks. Throughput vs floor = floor "
                  "seconds / method seconds (1.00x = at the floor). Cold = the files' pages evicted with "
                  "posix_fadvise(DONTNEED); on a VM the host may still cache the disk. CPU s is this process's CPU "
                  "time (all threads). Goals use medians over rounds; 'per round' pairs each round's own floor.[/]")
    cost = machine.fresh_memory_cost()
    console.print(machine.describe(cost))
    report = {
        "size_bytes": nbytes,
        "arrays": args.arrays,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "manager_config_overrides": args.overrides,
        "cpus": os.cpu_count(),
        "device": str(jax.devices()[0]),
        "platform": platform.platform(),
        "versions": {"jax": jax.__version__, "orbax-checkpoint": ocp.__version__},
        "results": results,
        "floors_seconds": floor,
        "floors_seconds_old": floor_old,
        "cores": cores,
        "goals": goals,
        "disk_bytes": disk,
        "page_cache_bytes_after_evict": left,
        "samples_seconds": wall,
        "cpu_samples_seconds": cpu,
        "machine": cost,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        console.print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
