"""Benchmark: maxckpt convert against the I/O floor, and the older throughput tables.

``--suite io-limit`` (the default) builds a synthetic MaxText param-only
checkpoint per ``--sizes`` (GB: 0.5 by default; 0.5,2,8 for the full run)
with Orbax (scanned layers, zarr3 + OCDBT, zstd, as MaxText writes it) and, in
fresh subprocesses, measures for every target (``--targets``: hf, maxtext,
megatron, torchtitan, torch) MaxText -> X and, from that output, X -> MaxText
(``--no-reverse`` skips it):

- maxckpt:      ``maxckpt.convert(src, dst, to=X, workers=--convert-workers)``, output fsynced;
- read floor:   a parallel TensorStore read of the source right after it (an
                Orbax source: every array read and decoded, all at once under
                1 GB in flight; any other: every file's bytes through
                TensorStore's file kvstore in 64 MiB ranges);
- write floor:  a raw write+fsync of the output's bytes (same file sizes).

It prints maxckpt's time over the floor, max(read wall, write wall, (read
CPU + write CPU) / cores) - the goal is <= 1.3 - beside issue 13's old floor
max(read, write) (which assumes the read and the write overlap for free,
though on a small machine each keeps every core busy), the CPU time (user +
system, all threads, from os.times() in each worker around its timed work)
of maxckpt and of the floors, and peak RSS against 2 x the largest piece (the largest tensor of
source or output as stored) + 300 MB. Under the table, and in every JSON row,
goes what this machine charges to fault in fresh memory (benchmarks/machine.py):
where that is large, kernel time dominates the table.

    python benchmarks/convert.py --sizes 0.5,2 --repeats 2 --json io.json
    python benchmarks/convert.py --targets hf --no-reverse --convert-workers 1

``--suite throughput`` is the older comparison. For each size it builds the same
checkpoint and measures, each in a fresh subprocess so peak RSS is clean:

- copy:        a plain file copy of the checkpoint's bytes;
- maxckpt:     `maxckpt.convert(..., to="hf")` with the default read budget;
- maxckpt-small: the same with `--read-budget` small (flat memory, more chunk decodes);
- restore-all: Orbax restores every array, the HF tensors are built in memory,
               then written with `safetensors.numpy.save_file` (how MaxText's
               own converter works: load the model, convert, save);
- megatron, torchtitan: `maxckpt.convert(..., to="megatron" | "torchtitan")`.

Then, from the Megatron and TorchTitan DCP checkpoints of the same model
(written beforehand, untimed), one `torch.save` file each way:

- dcp->torch maxckpt:  `maxckpt.convert(dcp_dir, "model.pt", to="torch")`
                       (streams; HF names, so Megatron's fused QKV is split);
- dcp_to_torch_save:   `torch.distributed.checkpoint.format_utils.dcp_to_torch_save`
                       (loads the whole state dict, saves it with native names).

Every method ends by fsync-ing its output, inside the timed region. The page
cache is warm for all methods (the checkpoint was just written). Each method
runs `--repeats` times; the fastest run counts, the largest peak RSS is shown. Throughput
is model bytes / seconds; "x copy" is that over the copy's throughput.

With ``--object-store gs`` (or ``s3``) each checkpoint is also uploaded to a
local emulator (fake-gcs-server / moto, as in the tests) and converted from
the bucket (``gs://.../checkpoints`` -> a local HF folder), reported beside
the same conversion from local disk: throughput, and peak RSS, which must stay
flat as the model grows (reads are parallel ranged GETs of bounded size).

    python benchmarks/convert.py --suite throughput --sizes 0.1,0.2,0.4 --methods copy,maxckpt --object-store gs

A synthetic MoE (mixtral layout: experts stored `[X, L, emb, mlp]`, 8
experts) of `--moe-sizes` GB goes through the same copy / maxckpt /
maxckpt with a small read budget comparison; its table also shows the
largest single piece (one expert's kernel), which is what peak memory should
stay near, not experts x layers.

    python benchmarks/convert.py --suite throughput                       # 0.25, 0.5, 1, 2 GB dense; 2 GB MoE
    python benchmarks/convert.py --suite throughput --sizes "" --moe-sizes 3     # the MoE case alone
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import machine  # noqa: E402 - benchmarks/machine.py, beside this script (after the sys.path line)

# Fixed width; layers grow with the size. float32 like a MaxText training run.
EMB, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 1024, 8, 8, 128, 4096, 8192
DTYPE = "float32"
RATIO_GOAL = 1.3  # issue 27: maxckpt within 1.3x of the CPU-counting floor (cpu_floor); goals.py reads it from each row


def spec_for(layers: int):
    from maxckpt.conversion.spec import family_defaults
    from maxckpt.families import FAMILIES
    from maxckpt.layouts.base import ModelSpec

    return ModelSpec("llama2", layers, EMB, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB, **family_defaults(FAMILIES["llama2"]))


# The MoE case: mixtral's MaxText layout, experts stacked [X, L, EMB, MOE_MLP].
EXPERTS, MOE_MLP = 8, 2048


def moe_spec_for(layers: int):
    from maxckpt.conversion.spec import family_defaults
    from maxckpt.families import FAMILIES
    from maxckpt.layouts.base import ModelSpec

    values = {**family_defaults(FAMILIES["mixtral"]), "num_experts": EXPERTS, "moe_mlp_dim": MOE_MLP, "num_experts_per_tok": 2}
    return ModelSpec("mixtral", layers, EMB, HEADS, KV_HEADS, HEAD_DIM, MOE_MLP, VOCAB, **values)


def moe_layers_for(size_gb: float) -> int:
    per_layer = 4 * (4 * EMB * HEADS * HEAD_DIM + 3 * EXPERTS * EMB * MOE_MLP + EXPERTS * EMB + 2 * EMB)
    fixed = 4 * (2 * VOCAB * EMB + EMB)
    return max(1, round((size_gb * 1e9 - fixed) / per_layer))


def bytes_per_layer() -> int:
    return 4 * (4 * EMB * HEADS * HEAD_DIM + 3 * EMB * MLP + 2 * EMB)


def layers_for(size_gb: float) -> int:
    fixed = 4 * (2 * VOCAB * EMB + EMB)
    return max(1, round((size_gb * 1e9 - fixed) / bytes_per_layer()))


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads)."""
    t = os.times()
    return t.user + t.system


def current_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def fsync_tree(path: Path) -> None:
    if Path(path).is_file():
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        return
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


# ------------------------------------------------------------------ workers


def worker_build(args) -> dict:
    """Write a synthetic MaxText param-only checkpoint with Orbax, as MaxText does."""
    import numpy as np
    import orbax.checkpoint as ocp

    from maxckpt.formats.maxtext.layout import as_tree
    from maxckpt.formats.maxtext.params import global_params, layer_params

    spec = spec_for(args.layers)
    rng = np.random.default_rng(0)
    flat = {}
    for p in global_params(spec):
        flat[p.key] = rng.standard_normal(p.framework_shape(spec), dtype=np.float32) * 0.02
    for p in layer_params(spec, moe=False):
        shape = list(p.framework_shape(spec))
        shape.insert(1, spec.num_layers)
        flat["decoder/layers/" + p.key] = rng.standard_normal(shape, dtype=np.float32) * 0.02
    tree = as_tree(flat)
    state = {"params": {"params": tree}}
    chunk = int(args.chunk_mb * 2**20) or None
    save_args = {"params": {"params": _map(tree, lambda _: ocp.SaveArgs(chunk_byte_size=chunk))}}
    manager = ocp.CheckpointManager(
        Path(args.out), item_names=("items",),
        item_handlers={"items": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)},
    )
    manager.save(0, args=ocp.args.Composite(items=ocp.args.PyTreeSave(state, save_args=save_args)))
    manager.wait_until_finished()
    manager.close()
    return {"model_bytes": sum(a.nbytes for a in flat.values()), "largest_tensor": max(a.nbytes for a in flat.values())}


def worker_build_moe(args) -> dict:
    """Write a synthetic scanned MaxText mixtral checkpoint with Orbax (every tensor MaxText would have)."""
    import numpy as np
    import orbax.checkpoint as ocp

    from maxckpt.formats.maxtext.layout import MaxTextLayout, as_tree

    spec = moe_spec_for(args.layers)
    rng = np.random.default_rng(0)
    flat = {name: rng.standard_normal(shape, dtype=np.float32) * 0.02
            for name, shape in MaxTextLayout().expected_tensors(spec, scanned=True).items()}
    tree = as_tree(flat)
    chunk = int(args.chunk_mb * 2**20) or None
    save_args = {"params": {"params": _map(tree, lambda _: ocp.SaveArgs(chunk_byte_size=chunk))}}
    manager = ocp.CheckpointManager(
        Path(args.out), item_names=("items",),
        item_handlers={"items": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)},
    )
    manager.save(0, args=ocp.args.Composite(items=ocp.args.PyTreeSave({"params": {"params": tree}}, save_args=save_args)))
    manager.wait_until_finished()
    manager.close()
    return {"model_bytes": sum(a.nbytes for a in flat.values()), "largest_tensor": max(a.nbytes for a in flat.values()),
            "one_expert": 4 * EMB * MOE_MLP}


def _map(tree, fn):
    return {k: _map(v, fn) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def worker_copy(args) -> dict:
    idle = current_rss()
    start = time.perf_counter()
    shutil.copytree(args.src, args.dst)
    fsync_tree(Path(args.dst))
    return {"seconds": time.perf_counter() - start, "peak_rss": peak_rss(), "idle_rss": idle}


def worker_maxckpt(args) -> dict:
    from maxckpt.conversion import SourceOptions, allocator, convert
    from maxckpt.formats import detect_format

    allocator.keep_large_buffers()  # as `maxckpt convert` does (the API leaves the caller's allocator alone)

    # torch's import time is not conversion time; import what the conversion itself would, no more
    # (torch.distributed.checkpoint, which a torch-file conversion never loads, adds about 50 MB of RSS).
    formats = {args.to, detect_format(Path(args.src)).name}
    if formats & {"megatron", "torchtitan"}:
        import maxckpt.containers.dcp  # noqa: F401
    if "torch" in formats:
        import maxckpt.containers.torch_file  # noqa: F401
    idle = current_rss()
    start = time.perf_counter()
    cpu = cpu_seconds()
    overrides = {"num_experts_per_tok": 2} if args.model == "mixtral" else {}
    overrides.update(json.loads(args.overrides_json))  # what a MaxText source cannot say (`maxckpt convert --set`)
    source = SourceOptions(read_budget=args.read_budget or None, overrides=overrides or None)
    convert(args.src, args.dst, to=args.to, model=args.model, source=source,
            workers=int(args.workers) if args.workers else None)
    fsync_tree(Path(args.dst))
    return {"seconds": time.perf_counter() - start, "peak_rss": peak_rss(), "idle_rss": idle, "cpu": cpu_seconds() - cpu}


def worker_dcp_to_torch_save(args) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from maxckpt.formats import get_format

    # The DCP dir inside the Megatron root / TorchTitan folder, found as maxckpt's readers find it.
    fmt = get_format(args.to)
    dcp_dir = fmt.open_reader(Path(args.src), _options()).path
    idle = current_rss()
    start = time.perf_counter()
    dcp_to_torch_save(str(dcp_dir), args.dst)
    fsync_tree(Path(args.dst))
    return {"seconds": time.perf_counter() - start, "peak_rss": peak_rss(), "idle_rss": idle}


def _options():
    from maxckpt.formats import ConversionOptions

    return ConversionOptions()


def worker_restore_all(args) -> dict:
    import numpy as np
    import orbax.checkpoint as ocp
    from safetensors.numpy import save_file

    from maxckpt.formats.maxtext.layout import MaxTextLayout
    from maxckpt.tensors import LazyTensor

    idle = current_rss()
    start = time.perf_counter()
    items = next(Path(args.src).glob("*/items"))
    restored = ocp.PyTreeCheckpointer().restore(items)  # every array in memory
    flat = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}/")
            else:
                flat[prefix + k] = np.asarray(v)

    walk(restored["params"]["params"], "")
    hf = MaxTextLayout().to_hf({n: LazyTensor.from_array(n, a) for n, a in flat.items()}, spec_for(args.layers))
    state = {name: t.read() for name, t in hf.items()}  # the whole HF model in memory too
    os.makedirs(args.dst)
    save_file(state, os.path.join(args.dst, "model.safetensors"), metadata={"format": "pt"})
    fsync_tree(Path(args.dst))
    return {"seconds": time.perf_counter() - start, "peak_rss": peak_rss(), "idle_rss": idle}


def worker_maxckpt_process(args) -> dict:
    """One of `--num-processes` conversion processes (jax.distributed on 127.0.0.1); process 0 fsyncs DST."""
    from maxckpt.conversion import Distributed, allocator, convert

    allocator.keep_large_buffers()  # as `maxckpt convert` does
    if args.to in ("megatron", "torchtitan", "torch"):
        import maxckpt.containers.dcp  # noqa: F401  (torch's import time is not conversion time)
    if args.num_processes > 1:
        import jax  # noqa: F401  (nor is JAX's)
    start = time.perf_counter()
    distributed = None
    if args.num_processes > 1:
        distributed = Distributed(coordinator=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
    report = convert(args.src, args.dst, to=args.to, model=args.model, distributed=distributed)
    if args.process_id == 0 and "://" not in args.dst:  # a bucket DST is durable once committed
        fsync_tree(Path(args.dst))
    return {"seconds": time.perf_counter() - start, "peak_rss": peak_rss(), "bytes": report.bytes}


# ------------------------------------------------- the I/O-limit suite (floors)


def worker_read_floor(args) -> dict:
    """The source's parallel-read floor through TensorStore, measured on its own.

    An Orbax source: every array opened and read (decoded) with reads of all
    arrays issued at once, at most ~1 GB in flight. Any other source (safetensors,
    DCP, torch files): every file's bytes read through TensorStore's file
    kvstore in 64 MiB ranges, all issued at once under the same bound.
    """
    import tensorstore as ts

    from maxckpt.containers.orbax import find_items_dir

    src = Path(args.src)
    limit, started, cpu = 1 << 30, time.perf_counter(), cpu_seconds()
    pending: list = []
    inflight = 0

    def submit(nbytes: int, future) -> None:
        nonlocal inflight
        pending.append((nbytes, future))
        inflight += nbytes
        while inflight > limit:
            n, f = pending.pop(0)
            f.result()
            inflight -= n

    try:
        items, _ = find_items_dir(src)
    except Exception:  # noqa: BLE001 - not an Orbax checkpoint: read its files
        items = None
    total = 0
    if items is not None:
        from maxckpt.containers.orbax import OrbaxReader

        reader = OrbaxReader(items)  # its own TensorStore context, as a conversion's (mapped reads included)
        for name, store in reader._open_all().items():  # the stores maxckpt reads through, nothing else
            nbytes = store.dtype.numpy_dtype.itemsize * int(np.prod(store.shape))
            total += nbytes
            submit(nbytes, store.read())
    else:
        files = [src] if src.is_file() else sorted(f for f in src.rglob("*") if f.is_file())
        root = src.parent if src.is_file() else src
        kv = ts.KvStore.open({"driver": "file", "path": str(root) + "/"}).result()
        step = 64 << 20
        for f in files:
            size = f.stat().st_size
            total += size
            key = f.relative_to(root).as_posix()
            for lo in range(0, size, step):
                submit(min(step, size - lo), kv.read(key, byte_range=slice(lo, min(size, lo + step))))
    for _, f in pending:
        f.result()
    return {"seconds": time.perf_counter() - started, "bytes": total, "peak_rss": peak_rss(), "cpu": cpu_seconds() - cpu}


def worker_write_floor(args) -> dict:
    """Raw write+fsync of the same bytes as an output: the same file sizes, 16 MiB writes, each file fsynced."""
    sizes = json.loads(args.sizes_json)
    block = memoryview(np.random.default_rng(0).integers(0, 256, 16 << 20, dtype=np.uint8).tobytes())  # no copy per write
    os.makedirs(args.dst)
    started, cpu = time.perf_counter(), cpu_seconds()
    for k, size in enumerate(sizes):
        fd = os.open(os.path.join(args.dst, f"f{k}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = size
            while left > 0:
                left -= os.write(fd, block[: min(left, len(block))])
            os.fsync(fd)
        finally:
            os.close(fd)
    return {"seconds": time.perf_counter() - started, "peak_rss": peak_rss(), "cpu": cpu_seconds() - cpu}


def worker_largest(args) -> dict:
    """The largest tensor of a checkpoint (any format), as stored: what one read or write holds at least."""
    from maxckpt.conversion.checkpoint import open_checkpoint

    with open_checkpoint(args.src, model=args.model) as ckpt:
        return {"largest": max(t.nbytes for t in ckpt.tensors().values())}


WORKERS = {
    "maxckpt-process": worker_maxckpt_process,
    "build": worker_build,
    "build-moe": worker_build_moe,
    "copy": worker_copy,
    "maxckpt": worker_maxckpt,
    "restore-all": worker_restore_all,
    "dcp_to_torch_save": worker_dcp_to_torch_save,
    "read-floor": worker_read_floor,
    "write-floor": worker_write_floor,
    "largest": worker_largest,
}


def run_worker(kind: str, **kwargs) -> dict:
    argv = [sys.executable, __file__, "--worker", kind]
    for key, value in kwargs.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=machine.installed_env({**os.environ, "JAX_PLATFORMS": "cpu"}))
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _remove_out(path: "Path | str") -> None:
    if isinstance(path, str):  # a bucket URL
        from maxckpt.storage import objects

        objects.rmtree(path)
    else:
        _remove(path)


def _remove(path: Path) -> None:
    if path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def best_of(repeats: int, kind: str, dst: Path, **kwargs) -> dict:
    """The fastest of `repeats` fresh-process runs (peak RSS: the largest seen)."""
    runs = []
    for _ in range(repeats):
        _remove(dst)
        runs.append(run_worker(kind, dst=dst, **kwargs))
    _remove(dst)
    best = min(runs, key=lambda r: r["seconds"])
    return {**best, "peak_rss": max(r["peak_rss"] for r in runs), "all_seconds": [r["seconds"] for r in runs]}


def _upload(local: Path, url: str) -> None:
    """Copy a local checkpoint folder to a bucket, file by file (streamed)."""
    from maxckpt.storage import objects

    for file in sorted(p for p in local.rglob("*") if p.is_file()):
        with open(file, "rb") as f, objects.open_write(f"{url}/{file.relative_to(local).as_posix()}") as out:
            shutil.copyfileobj(f, out, 16 << 20)


def _print_subset(console, results: list, object_store: str) -> None:
    """One table for a --methods subset: each method's throughput and peak RSS (and the bucket's, if any)."""
    from rich.table import Table

    mb = 1e6
    kinds = [k for k in ("copy", "maxckpt", "maxckpt-small", "restore-all", "megatron", "torchtitan", "maxckpt-remote",
                         "maxckpt-remote-small")
             if results and k in results[0]]
    names = {"maxckpt": "maxckpt local disk -> hf", "maxckpt-remote": f"maxckpt {object_store}:// emulator -> hf",
             "maxckpt-small": "local, small read budget", "maxckpt-remote-small": f"{object_store}://, small read budget"}
    table = Table(title="MaxText (Orbax) -> HF safetensors", title_justify="left")
    table.add_column("size", justify="right")
    for k in kinds:
        table.add_column(f"{names.get(k, k)} MB/s", justify="right")
        table.add_column("peak RSS", justify="right")
    for r in results:
        cells = [f"{r['model_bytes'] / 1e9:.2f} GB"]
        for k in kinds:
            cells += [f"{r['model_bytes'] / mb / r[k]['seconds']:.0f}", f"{r[k]['peak_rss'] / mb:.0f} MB"]
        table.add_row(*cells)
    console.print(table)


def _file_sizes(path: Path) -> list[int]:
    return [path.stat().st_size] if path.is_file() else [f.stat().st_size for f in sorted(path.rglob("*")) if f.is_file()]


def evict(path: Path) -> None:
    """Drop the page-cache pages of every file under `path` (posix_fadvise DONTNEED), so the next read is cold."""
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(repeats: int, kind: str, dst: Path | None, keep: bool = False, cold: Path | None = None, **kwargs) -> dict:
    """The fastest of `repeats` fresh-process runs of a worker (peak RSS: the largest seen); `keep` leaves the last output.

    `cold`: evict this source from the page cache before every run.
    """
    runs = []
    for k in range(repeats):
        if dst is not None:
            _remove(dst)
        if cold is not None:
            evict(cold)
        runs.append(run_worker(kind, **({"dst": dst} if dst is not None else {}), **kwargs))
    if dst is not None and not keep:
        _remove(dst)
    best = min(runs, key=lambda r: r["seconds"])
    return {**best, "peak_rss": max(r["peak_rss"] for r in runs), "all_seconds": [r["seconds"] for r in runs]}


def cpu_floor(read_s: float, write_s: float, cpu_s: float, cores: int) -> dict:
    """The floor that counts the CPU: max(read wall, write wall, (read CPU + write CPU) / cores).

    A conversion must both read and write; when the read and the write each
    keep every core busy, they cannot overlap, and their summed CPU time spread
    over the cores bounds the conversion from below. max(read, write) alone
    (``floor_old``, issue 13's floor) assumes they overlap for free.
    """
    old = max(read_s, write_s)
    return {"floor": max(old, cpu_s / cores), "floor_old": old, "floor_cpu_bound": cpu_s / cores, "cores": cores}


def _one_conversion(args, console, case: Path, src: Path, to: str, label: str, keep: bool) -> tuple[dict, Path]:
    """maxckpt convert src -> `to`, then the floors of that conversion, measured right after it in this run."""
    dst = case / f"out-{label.replace(' ', '').replace('->', '-to-')}"
    console.print(f"  {label}: maxckpt ...")
    cold = src if args.cache == "cold" else None
    ours = _timed(args.repeats, "maxckpt", dst, keep=True, cold=cold, src=src, to=to, workers=args.convert_workers or "")
    sizes = _file_sizes(dst)
    console.print(f"  {label}: floors ...")
    read = _timed(args.repeats, "read-floor", None, cold=cold, src=src)
    write = _timed(args.repeats, "write-floor", case / "floor-write", sizes_json=json.dumps(sizes))
    largest = max(run_worker("largest", src=src)["largest"], run_worker("largest", src=dst)["largest"])
    floors = cpu_floor(read["seconds"], write["seconds"], read["cpu"] + write["cpu"], os.cpu_count() or 1)
    row = {
        "conversion": label, "cache": args.cache, "seconds": ours["seconds"], "all_seconds": ours["all_seconds"], "peak_rss": ours["peak_rss"],
        "idle_rss": ours["idle_rss"], "read_floor": read["seconds"], "write_floor": write["seconds"],
        "source_bytes": read["bytes"], "output_bytes": sum(sizes), **floors, "ratio": ours["seconds"] / floors["floor"],
        "ratio_old": ours["seconds"] / floors["floor_old"], "ratio_goal": RATIO_GOAL, "largest_piece": largest,
        "rss_goal": 2 * largest + 300e6, "cpu": ours["cpu"], "floor_cpu": read["cpu"] + write["cpu"],
        "read_cpu": read["cpu"], "write_cpu": write["cpu"],
    }
    if not keep:
        _remove(dst)
    return row, dst


def io_limit_suite(args, console, work: Path) -> list[dict]:
    """MaxText -> every target, and each target -> MaxText, against max(parallel read, raw write+fsync)."""
    from rich.table import Table

    targets = [t for t in args.targets.split(",") if t]
    rows = []
    for size in [float(s) for s in (args.sizes if args.sizes is not None else "0.5").split(",") if s.strip()]:
        layers = layers_for(size)
        case = work / f"io-{size:g}GB"
        shutil.rmtree(case, ignore_errors=True)
        console.print(f"[bold]{size:g} GB[/]: {layers} layers, building the checkpoint with Orbax ...")
        built = run_worker("build", out=case / "checkpoints", layers=layers, chunk_mb=args.chunk_mb)
        src = case / "checkpoints"
        for to in targets:
            reverse = args.reverse and to != "maxtext"
            row, out = _one_conversion(args, console, case, src, to, f"maxtext -> {to}", keep=reverse)
            rows.append({"size_gb": size, "model_bytes": built["model_bytes"], **row})
            if reverse:
                back, _ = _one_conversion(args, console, case, out, "maxtext", f"{to} -> maxtext", keep=False)
                rows.append({"size_gb": size, "model_bytes": built["model_bytes"], **back})
                _remove(out)
        shutil.rmtree(case, ignore_errors=True)
    mb = 1e6
    workers = args.convert_workers or f"{os.cpu_count()} (default: the cores)"
    table = Table(
        title=f"maxckpt convert against the I/O floor, {DTYPE}, {args.cache} page cache, --workers {workers}, {os.cpu_count()} cores; "
        f"floor = max(parallel TensorStore read of the source, raw write+fsync of the output bytes, (read CPU + write CPU) / "
        f"{os.cpu_count()} cores); goal: ratio <= {RATIO_GOAL}, peak RSS <= 2 x largest piece + 300 MB; "
        "old ratio: against issue 13's max(read, write)",
        title_justify="left",
    )
    for col in ("model", "conversion", "maxckpt s", "read floor s", "write floor s", "CPU floor s", "ratio", "old ratio",
                "maxckpt CPU s", "floors' CPU s", "peak RSS", "largest piece", "RSS goal", "goals met"):
        table.add_column(col, justify="right")
    for r in rows:
        met = ("time" if r["ratio"] <= r["ratio_goal"] else "") + (" rss" if r["peak_rss"] <= r["rss_goal"] else "")
        table.add_row(
            f"{r['model_bytes'] / 1e9:.2f} GB", r["conversion"], f"{r['seconds']:.2f}", f"{r['read_floor']:.2f}",
            f"{r['write_floor']:.2f}", f"{r['floor_cpu_bound']:.2f}", f"{r['ratio']:.2f}", f"{r['ratio_old']:.2f}",
            f"{r['cpu']:.1f}", f"{r['floor_cpu']:.1f}", f"{r['peak_rss'] / mb:.0f} MB", f"{r['largest_piece'] / mb:.0f} MB",
            f"{r['rss_goal'] / mb:.0f} MB", met.strip() or "-",
        )
    console.print(table)
    if rows:
        console.print(f"RSS after imports, before any work: {rows[0]['idle_rss'] / mb:.0f} MB (counted in peak RSS); "
                      "CPU s: user + system time of all threads (floors: read + write), the work a machine's cores share")
    cost = machine.fresh_memory_cost()
    console.print(machine.describe(cost))
    return [{**r, **cost} for r in rows]


# --------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("io-limit", "throughput"), default="io-limit",
                        help="io-limit (default): every target and back against the read/write floors; "
                        "throughput: the older tables (copy, restore-all, MoE, object stores, dcp_to_torch_save)")
    parser.add_argument("--sizes", default=None, help="checkpoint sizes in GB, comma-separated, e.g. 0.5,2,8 (\"\": none; "
                        "default 0.5 for io-limit, 0.25,0.5,1,2 for throughput)")
    parser.add_argument("--targets", default=None, help="target formats, comma-separated (hf,maxtext,megatron,torchtitan,torch; "
                        "default: all of them for io-limit, hf with --processes)")
    parser.add_argument("--no-reverse", dest="reverse", action="store_false", help="io-limit: skip the X -> maxtext direction")
    parser.add_argument("--cache", choices=("warm", "cold"), default="warm",
                        help="io-limit: the source in the page cache (warm, default) or evicted before each conversion and "
                        "each read floor (cold: for models near the machine's memory, where warm is not what a run sees)")
    parser.add_argument("--convert-workers", default="", help="--workers for maxckpt (default: the cores)")
    parser.add_argument("--moe-sizes", default="2", help="synthetic MoE (mixtral) checkpoint sizes in GB (\"\": none)")
    parser.add_argument("--chunk-mb", type=float, default=64, help="Orbax chunk_byte_size of the synthetic checkpoints (0: one chunk per array)")
    parser.add_argument("--small-budget", default="256MB", help="--read-budget of the maxckpt-small run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per method; the fastest counts (machines are noisy)")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temp dir, removed after)")
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    parser.add_argument("--methods", default="all", help="comma-separated subset of copy,maxckpt,maxckpt-small,restore-all,megatron,torchtitan,dcp (default all)")
    parser.add_argument("--processes", default="", help="scale-out table instead: convert with each of these process counts "
                        "(e.g. 1,2,4; jax.distributed on 127.0.0.1) beside a plain copy of the same bytes")
    parser.add_argument("--object-store", choices=("none", "gs", "s3"), default="none",
                        help="also convert from a bucket on a local emulator (gs: fake-gcs-server, s3: moto); with --processes: DST in such a bucket")
    # worker mode (internal)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--dst", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--read-budget", default="", help=argparse.SUPPRESS)
    parser.add_argument("--to", default="hf", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="llama2", help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default="", help=argparse.SUPPRESS)
    parser.add_argument("--num-processes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--workers", default="", help=argparse.SUPPRESS)
    parser.add_argument("--sizes-json", default="[]", help=argparse.SUPPRESS)
    parser.add_argument("--overrides-json", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        if args.worker == "maxckpt" and args.read_budget:
            from maxckpt.containers.safetensors import parse_size

            args.read_budget = parse_size(args.read_budget)
        print(json.dumps(WORKERS[args.worker](args)))
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(180, Console().width))
    if args.targets is None:
        args.targets = "hf" if args.processes else "hf,maxtext,megatron,torchtitan,torch"
    if args.processes:
        scale_out(args, console)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="maxckpt-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.suite == "io-limit":
        try:
            rows = io_limit_suite(args, console, work)
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
        return
    if args.sizes is None:
        args.sizes = "0.25,0.5,1,2"
    results, moe_results = [], []
    wanted = None if args.methods == "all" else set(args.methods.split(","))
    store = bucket = None
    if args.object_store != "none":
        sys.path.insert(0, str(REPO / "tests"))
        import object_stores  # the emulators the tests use; workers inherit their environment

        store = object_stores.server(args.object_store)
        bucket = store.new_bucket()
    try:
        for size in [float(s) for s in args.moe_sizes.split(",") if s.strip()]:
            layers = moe_layers_for(size)
            case = work / f"moe-{size:g}GB"
            shutil.rmtree(case, ignore_errors=True)
            console.print(f"[bold]MoE {size:g} GB[/]: {layers} layers x {EXPERTS} experts, building the checkpoint with Orbax ...")
            built = run_worker("build-moe", out=case / "checkpoints", layers=layers, chunk_mb=args.chunk_mb)
            row = {"size_gb": size, "layers": layers, **built, "chunk_mb": args.chunk_mb}
            src = case / "checkpoints"
            for kind, worker, extra in (
                ("copy", "copy", {"src": src}),
                ("maxckpt", "maxckpt", {"src": src, "to": "hf", "model": "mixtral"}),
                ("maxckpt-small", "maxckpt", {"src": src, "to": "hf", "model": "mixtral", "read_budget": args.small_budget}),
            ):
                console.print(f"  {kind} ...")
                row[kind] = best_of(args.repeats, worker, case / f"out-{kind}", **extra)
            shutil.rmtree(case, ignore_errors=True)
            moe_results.append(row)
        for size in [float(s) for s in args.sizes.split(",") if s.strip()]:
            layers = layers_for(size)
            case = work / f"{size:g}GB"
            shutil.rmtree(case, ignore_errors=True)
            console.print(f"[bold]{size:g} GB[/]: {layers} layers, building the checkpoint with Orbax ...")
            built = run_worker("build", out=case / "checkpoints", layers=layers, chunk_mb=args.chunk_mb)
            row = {"size_gb": size, "layers": layers, **built, "chunk_mb": args.chunk_mb}
            src = case / "checkpoints"
            for kind, worker, extra in (
                ("copy", "copy", {"src": src}),
                ("maxckpt", "maxckpt", {"src": src, "to": "hf"}),
                ("maxckpt-small", "maxckpt", {"src": src, "to": "hf", "read_budget": args.small_budget}),
                ("restore-all", "restore-all", {"src": src, "layers": layers}),
                ("megatron", "maxckpt", {"src": src, "to": "megatron"}),
                ("torchtitan", "maxckpt", {"src": src, "to": "torchtitan"}),
            ):
                if wanted is not None and kind not in wanted:
                    continue
                console.print(f"  {kind} ...")
                row[kind] = best_of(args.repeats, worker, case / f"out-{kind}", **extra)
            if store is not None:
                url = store.url(bucket, f"{size:g}GB", "checkpoints")
                console.print(f"  uploading to {url} ...")
                _upload(src, url)
                console.print(f"  maxckpt from {args.object_store}:// ...")
                row["maxckpt-remote"] = best_of(args.repeats, "maxckpt", case / "out-remote", src=url, to="hf")
                if wanted is None or "maxckpt-small" in wanted:
                    row["maxckpt-remote-small"] = best_of(
                        args.repeats, "maxckpt", case / "out-remote", src=url, to="hf", read_budget=args.small_budget
                    )
            for fmt in ("torchtitan", "megatron") if wanted is None or "dcp" in wanted else ():
                dcp_src = case / f"src-{fmt}"
                console.print(f"  {fmt} DCP -> one torch file ...")
                run_worker("maxckpt", src=src, dst=dcp_src, to=fmt)  # the DCP source, untimed
                row[f"{fmt}-dcp-bytes"] = sum(f.stat().st_size for f in dcp_src.rglob("*.distcp"))
                row[f"{fmt}->torch maxckpt"] = best_of(args.repeats, "maxckpt", case / "out.pt", src=dcp_src, to="torch")
                row[f"{fmt}->torch dcp_to_torch_save"] = best_of(
                    args.repeats, "dcp_to_torch_save", case / "out.pt", src=dcp_src, to=fmt
                )
                shutil.rmtree(dcp_src, ignore_errors=True)
            shutil.rmtree(case, ignore_errors=True)
            results.append(row)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
        if store is not None:
            object_stores.stop_all()
    if wanted is not None:
        _print_subset(console, results, args.object_store)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))
        return

    mb = 1e6
    if moe_results:
        moe = Table(title=f"MoE (mixtral layout, {EXPERTS} experts stored [X, L, ...]) MaxText -> HF, {DTYPE}, warm page cache",
                    title_justify="left")
        for col in ("size", "layers", "one expert", "largest stored tensor", "copy MB/s", "maxckpt MB/s (x copy)",
                    "maxckpt peak RSS", f"--read-budget {args.small_budget} MB/s (x copy)", "its peak RSS"):
            moe.add_column(col, justify="right")
        for r in moe_results:
            speed = {k: r["model_bytes"] / mb / r[k]["seconds"] for k in ("copy", "maxckpt", "maxckpt-small")}
            moe.add_row(
                f"{r['model_bytes'] / 1e9:.2f} GB", str(r["layers"]), f"{r['one_expert'] / mb:.0f} MB",
                f"{r['largest_tensor'] / mb:.0f} MB", f"{speed['copy']:.0f}",
                f"{speed['maxckpt']:.0f} ({speed['maxckpt'] / speed['copy']:.2f})", f"{r['maxckpt']['peak_rss'] / mb:.0f} MB",
                f"{speed['maxckpt-small']:.0f} ({speed['maxckpt-small'] / speed['copy']:.2f})",
                f"{r['maxckpt-small']['peak_rss'] / mb:.0f} MB",
            )
        console.print(moe)
    if not results:
        if args.json:
            Path(args.json).write_text(json.dumps({"moe": moe_results}, indent=2, default=str))
        return
    table = Table(title=f"MaxText (Orbax, chunks <= {args.chunk_mb:g} MiB) -> HF safetensors, {DTYPE}, warm page cache", title_justify="left")
    for col in ("size", "layers", "largest tensor", "copy MB/s",
                "maxckpt MB/s (x copy)", "maxckpt peak RSS",
                f"maxckpt --read-budget {args.small_budget} (x copy)", "its peak RSS",
                "restore-all MB/s (x copy)", "restore-all peak RSS"):
        table.add_column(col, justify="right")
    for r in results:
        throughput = {k: r["model_bytes"] / mb / r[k]["seconds"] for k in ("copy", "maxckpt", "maxckpt-small", "restore-all")}
        ratio = {k: v / throughput["copy"] for k, v in throughput.items()}
        table.add_row(
            f"{r['model_bytes'] / 1e9:.2f} GB",
            str(r["layers"]),
            f"{r['largest_tensor'] / mb:.0f} MB",
            f"{throughput['copy']:.0f}",
            f"{throughput['maxckpt']:.0f} ({ratio['maxckpt']:.2f})",
            f"{r['maxckpt']['peak_rss'] / mb:.0f} MB",
            f"{throughput['maxckpt-small']:.0f} ({ratio['maxckpt-small']:.2f})",
            f"{r['maxckpt-small']['peak_rss'] / mb:.0f} MB",
            f"{throughput['restore-all']:.0f} ({ratio['restore-all']:.2f})",
            f"{r['restore-all']['peak_rss'] / mb:.0f} MB",
        )
    console.print(table)

    targets = Table(title="MaxText (Orbax) -> PyTorch frameworks with maxckpt, same checkpoints", title_justify="left")
    for col in ("size", "copy MB/s", "-> hf MB/s (x copy)", "peak RSS", "-> megatron MB/s (x copy)", "peak RSS",
                "-> torchtitan MB/s (x copy)", "peak RSS"):
        targets.add_column(col, justify="right")
    for r in results:
        copy = r["model_bytes"] / mb / r["copy"]["seconds"]
        cells = [f"{r['model_bytes'] / 1e9:.2f} GB", f"{copy:.0f}"]
        for kind in ("maxckpt", "megatron", "torchtitan"):
            speed = r["model_bytes"] / mb / r[kind]["seconds"]
            cells += [f"{speed:.0f} ({speed / copy:.2f})", f"{r[kind]['peak_rss'] / mb:.0f} MB"]
        targets.add_row(*cells)
    console.print(targets)

    dcp_table = Table(
        title="DCP dir -> one torch.save file: maxckpt convert --to torch (streaming, HF names) vs "
        "torch's dcp_to_torch_save (whole state dict, native names)",
        title_justify="left",
    )
    for col in ("size", "source", "maxckpt s", "maxckpt MB/s (x copy)", "maxckpt peak RSS",
                "dcp_to_torch_save s", "its MB/s (x copy)", "its peak RSS", "time ratio", "RSS ratio"):
        dcp_table.add_column(col, justify="right")
    for r in results:
        copy = r["model_bytes"] / mb / r["copy"]["seconds"]
        for fmt in ("torchtitan", "megatron"):
            ours, theirs = r[f"{fmt}->torch maxckpt"], r[f"{fmt}->torch dcp_to_torch_save"]
            size = r[f"{fmt}-dcp-bytes"]
            speed = {k: size / mb / v["seconds"] for k, v in (("ours", ours), ("theirs", theirs))}
            dcp_table.add_row(
                f"{size / 1e9:.2f} GB", fmt,
                f"{ours['seconds']:.2f}", f"{speed['ours']:.0f} ({speed['ours'] / copy:.2f})", f"{ours['peak_rss'] / mb:.0f} MB",
                f"{theirs['seconds']:.2f}", f"{speed['theirs']:.0f} ({speed['theirs'] / copy:.2f})", f"{theirs['peak_rss'] / mb:.0f} MB",
                f"{ours['seconds'] / theirs['seconds']:.2f}", f"{ours['peak_rss'] / theirs['peak_rss']:.2f}",
            )
    console.print(dcp_table)
    idle = {k: results[0][k]["idle_rss"] / mb for k in ("maxckpt", "restore-all")} if results else {}
    if idle:
        console.print(f"RSS after imports, before any work: maxckpt {idle['maxckpt']:.0f} MB, restore-all {idle['restore-all']:.0f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps({"dense": results, "moe": moe_results}, indent=2, default=str))


# ------------------------------------------------------------------ scale-out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(n: int, src: Path, dst: Path, to: str) -> dict:
    """`n` conversion processes started together; wall time from the first start to the last exit."""
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", "maxckpt-process", "--src", str(src), "--dst", str(dst), "--to", to,
             "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n), "--process-id", str(i)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for i in range(n)
    ]
    outs = [p.communicate() for p in procs]
    wall = time.perf_counter() - start
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            raise RuntimeError(f"process {i} of {n} failed:\n{err[-3000:]}")
    runs = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    return {"wall": wall, "seconds": max(r["seconds"] for r in runs), "peak_rss": max(r["peak_rss"] for r in runs)}


def scale_out(args, console) -> None:
    """`--processes 1,2,4`: the same conversion on 1, 2 and 4 processes, beside a plain copy of the bytes (the floor).

    "convert s" is the slowest process's `convert()` call (joining included),
    "wall s" adds starting the Python processes. On one host the processes
    share its cores and disk; across hosts each brings its own.
    """
    from rich.table import Table

    counts = [int(n) for n in args.processes.split(",") if n.strip()]
    targets = [t for t in args.targets.split(",") if t.strip()]
    work = Path(args.work or tempfile.mkdtemp(prefix="maxckpt-bench-"))
    rows = []
    out_url = None
    if args.object_store != "none":  # DST in a bucket of the emulator the tests use (workers inherit its environment)
        sys.path.insert(0, str(REPO / "tests"))
        import object_stores

        store = object_stores.server(args.object_store)
        out_url = store.url(store.new_bucket(), "out")
    try:
        for size in [float(s) for s in (args.sizes if args.sizes is not None else "0.25").split(",") if s.strip()]:
            layers = layers_for(size)
            case = work / f"{size:g}GB"
            shutil.rmtree(case, ignore_errors=True)
            console.print(f"[bold]{size:g} GB[/]: {layers} layers, building the checkpoint with Orbax ...")
            built = run_worker("build", out=case / "checkpoints", layers=layers, chunk_mb=args.chunk_mb)
            src = case / "checkpoints"
            copy = best_of(args.repeats, "copy", case / "out-copy", src=src)
            for to in targets:
                row = {"size_gb": size, "model_bytes": built["model_bytes"], "to": to, "copy": copy}
                for n in counts:
                    console.print(f"  {to} on {n} process(es) ...")
                    runs = []
                    out = out_url or case / "out"
                    for _ in range(args.repeats):
                        _remove_out(out)
                        runs.append(run_processes(n, src, out, to))
                    _remove_out(out)
                    row[n] = min(runs, key=lambda r: r["seconds"])
                rows.append(row)
            shutil.rmtree(case, ignore_errors=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
        if out_url is not None:
            object_stores.stop_all()
    where = f", DST on the {args.object_store}:// emulator" if out_url else ""
    table = Table(title=f"Scale-out: MaxText (Orbax) -> target on N local processes (jax.distributed){where}, {DTYPE}, {os.cpu_count()} cores",
                  title_justify="left")
    for col in ("size", "target", "copy s (floor)"):
        table.add_column(col, justify="right")
    for n in counts:
        table.add_column(f"{n} proc: convert s / wall s / x copy", justify="right")
    for r in rows:
        cells = [f"{r['model_bytes'] / 1e9:.2f} GB", r["to"], f"{r['copy']['seconds']:.2f}"]
        for n in counts:
            cells.append(f"{r[n]['seconds']:.2f} / {r[n]['wall']:.2f} / {r[n]['seconds'] / r['copy']['seconds']:.1f}x")
        table.add_row(*cells)
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
