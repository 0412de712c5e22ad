"""Benchmark: what the integrity manifests cost a conversion (goal: <= 5% of its time).

Builds the synthetic MaxText checkpoint of ``benchmarks/convert.py`` (scanned
layers, float32, zarr3 + OCDBT, written by plain Orbax: it has no manifest)
per ``--sizes`` GB, then for every ``--targets`` format converts, each run in
a fresh process with the output fsynced inside the timed region:

- MaxText -> X: hashing every tensor as it streams to X's writer (the source
  has no manifest, so nothing is checked);
- X -> MaxText, from that output: hashing the MaxText output *and* checking
  every source tensor read against X's manifest.

Each once with hashing ("on", as maxckpt always runs) and once with the
hashes stubbed out ("off": `Manifest.hash_ahead`/`add`/`add_piece` do nothing and the
source's manifest is not read), alternating, ``--repeats`` times; the fastest
run of each counts. Then manager saves of a float32 state of ``--saves`` GB
(16 arrays), async and sync, with and without the manifest: the time `save`
blocks the training loop (steps 1-3; step 0 compiles and creates). Prints
one table row per measurement (seconds on/off, overhead in %, and for
conversions the thread time spent inside CRC32C - all threads, the
hashing's own cost, which a busy machine's noise does not blur - as a share
of the run without hashing) and writes the rows as JSON (``--json``).

    python benchmarks/integrity.py --sizes 0.5 --repeats 3 --json integrity.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import convert as bench  # benchmarks/convert.py, beside this script

GOAL = 0.05  # at most 5% of the conversion's time


def worker(args) -> dict:
    from maxckpt import integrity
    from maxckpt.conversion import SourceOptions, allocator, convert

    allocator.keep_large_buffers()
    hashing = {"seconds": 0.0}  # thread time inside CRC32C, all threads together (the hashing's own cost)
    crc32c = integrity.crc32c

    def timed_crc32c(array, crc=0):
        start = time.thread_time()
        try:
            return crc32c(array, crc)
        finally:
            hashing["seconds"] += time.thread_time() - start

    integrity.crc32c = timed_crc32c
    if args.hashing == "off":
        integrity.Manifest.add = lambda self, name, array: None
        integrity.Manifest.add_piece = lambda self, *a, **k: None
        integrity.Manifest.hash_ahead = lambda self, *a, **k: None
        integrity.watch_source = lambda ckpt: None
    start = time.perf_counter()
    cpu = bench.cpu_seconds()
    source = SourceOptions(overrides={"head_dim": bench.HEAD_DIM})  # one torch file has no config.json
    convert(args.src, args.dst, to=args.to, model="llama2", source=source)
    bench.fsync_tree(Path(args.dst))
    return {"seconds": time.perf_counter() - start, "cpu": bench.cpu_seconds() - cpu, "hash_cpu": hashing["seconds"]}


def save_worker(args) -> dict:
    """Manager saves of a float32 state of --size-gb: the time save() blocks (async) or takes (sync), on/off."""
    import jax.numpy as jnp
    import numpy as np

    import maxckpt
    from maxckpt.manager import manifests, tier

    if args.hashing == "off":
        tier.ManifestJob = lambda step, state: None  # no hashing thread, no manifest
        _ = manifests
    n = int(float(args.size_gb) * 1e9 / 4 / 16)
    rng = np.random.default_rng(0)
    state = {"params": {f"w{i}": jnp.asarray(rng.standard_normal(n, np.float32)) for i in range(16)}}
    blocked, total = [], []
    with maxckpt.CheckpointManager(Path(args.dst), async_save=args.mode == "async", max_to_keep=2) as mgr:
        for step in range(4):
            start = time.perf_counter()
            mgr.save(step, state)
            blocked.append(time.perf_counter() - start)
            mgr.wait()
            total.append(time.perf_counter() - start)
    return {"seconds": min(blocked[1:]), "committed": min(total[1:]), "cpu": 0.0}


def measure_saves(work: Path, size: float, mode: str, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for _ in range(repeats):
        for hashing in ("off", "on"):
            dst = work / f"save-{mode}-{hashing}"
            _remove(dst)
            runs[hashing].append(run({"kind": "save", "dst": dst, "hashing": hashing, "mode": mode, "size-gb": size}))
            _remove(dst)
    on = min(r["seconds"] for r in runs["on"])
    off = min(r["seconds"] for r in runs["off"])
    return {"size_gb": size, "model_bytes": int(size * 1e9), "conversion": f"manager {mode} save (blocks)",
            "seconds_on": on, "seconds_off": off, "overhead": on / off - 1,
            "committed_on": min(r["committed"] for r in runs["on"]), "committed_off": min(r["committed"] for r in runs["off"]),
            "all_on": [r["seconds"] for r in runs["on"]], "all_off": [r["seconds"] for r in runs["off"]], "goal": GOAL}


def run(kind_args: dict) -> dict:
    import os
    import subprocess

    argv = [sys.executable, __file__, "--worker"] + [f"--{k}={v}" for k, v in kind_args.items()]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _remove(path: Path) -> None:
    if path.is_file():
        path.unlink()
        Path(f"{path}.maxckpt-manifest.json").unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def measure(src: Path, dst: Path, to: str, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for _ in range(repeats):
        for mode in ("off", "on"):
            _remove(dst)
            runs[mode].append(run({"src": src, "dst": dst, "to": to, "hashing": mode}))
    best = {m: min(r, key=lambda x: x["seconds"]) for m, r in runs.items()}
    on, off = best["on"]["seconds"], best["off"]["seconds"]
    return {
        "seconds_on": on, "seconds_off": off, "overhead": on / off - 1, "cpu_on": best["on"]["cpu"], "cpu_off": best["off"]["cpu"],
        "all_on": [r["seconds"] for r in runs["on"]], "all_off": [r["seconds"] for r in runs["off"]], "goal": GOAL,
        # CPU seconds spent hashing (source check + output), the least noisy measure: its share of the run without hashing
        "hash_cpu": min(r["hash_cpu"] for r in runs["on"]), "hash_share": min(r["hash_cpu"] for r in runs["on"]) / off,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.5", help="checkpoint sizes in GB, comma-separated")
    parser.add_argument("--targets", default="hf,megatron,torchtitan,torch,maxtext")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--work", default=None, help="scratch directory (default: a temp dir, removed after)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--saves", default="0.25", help="manager save sizes in GB (\"\": none)")
    parser.add_argument("--src"), parser.add_argument("--dst"), parser.add_argument("--to"), parser.add_argument("--hashing")
    parser.add_argument("--kind", default="convert"), parser.add_argument("--mode"), parser.add_argument("--size-gb")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(save_worker(args) if args.kind == "save" else worker(args)))
        return
    from rich.console import Console
    from rich.table import Table

    work = Path(args.work or tempfile.mkdtemp(prefix="maxckpt-integrity-bench-"))
    rows = []
    try:
        for size in [float(s) for s in args.sizes.split(",") if s]:
            case = work / f"{size:g}GB"
            src = case / "src"
            _remove(case)
            built = bench.run_worker("build", out=src, layers=bench.layers_for(size), chunk_mb=64)
            for to in [t for t in args.targets.split(",") if t]:
                out = case / ("out.pt" if to == "torch" else f"out-{to}")
                row = {"size_gb": size, "model_bytes": built["model_bytes"], "conversion": f"maxtext -> {to}",
                       **measure(src, out, to, args.repeats)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                # the last run was "on": `out` is the way back's source, with its manifest
                back = case / "back"
                row = {"size_gb": size, "model_bytes": built["model_bytes"], "conversion": f"{to} -> maxtext",
                       **measure(out, back, "maxtext", args.repeats)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                _remove(out), _remove(back)
        for size in [float(s) for s in args.saves.split(",") if s]:
            for mode in ("async", "sync"):
                row = measure_saves(work, size, mode, args.repeats)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    table = Table(title="integrity manifests: conversion time with and without hashing", title_justify="left")
    for col in ("GB", "conversion", "off s", "on s", "overhead", "hash CPU s", "hash / off", f"goal <= {GOAL:.0%}"):
        table.add_column(col, justify="right")
    for r in rows:
        share = r.get("hash_share")
        table.add_row(f"{r['model_bytes'] / 1e9:.2f}", r["conversion"], f"{r['seconds_off']:.2f}", f"{r['seconds_on']:.2f}",
                      f"{r['overhead']:+.1%}", f"{r['hash_cpu']:.3f}" if "hash_cpu" in r else "-",
                      f"{share:.1%}" if share is not None else "-", "ok" if min(r["overhead"], share or 1) <= GOAL else "over")
    Console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
