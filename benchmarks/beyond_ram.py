"""Beyond RAM: checkpoints larger than the machine's memory convert both ways, bit-exact, in bounded memory.

Why: the most common complaint about other converters is running out of host
RAM on 70B-671B models; maxckpt streams, so its peak RSS must not grow with
the model. For each ``--layouts`` (dense: llama2-13b's dimensions; mixtral:
mixtral-8x7b's, experts per expert on the HF side, stacked ``[X, L, ...]`` in
MaxText; deepseek: DeepSeek-V3's structure - MLA with a q LoRA, a leading
dense layer, 64 routed experts and 2 shared ones, the float32 routing bias -
at DeepSeek-V2-Lite-like widths) this script

1. writes a synthetic HF checkpoint (bf16 safetensors shards + config.json)
   larger than ``--size`` (default: this machine's RAM + 5%), streamed: no
   tensor is ever held whole; the values cycle through a 64 MiB pool of
   normal(0, 0.02) bf16 numbers from a per-tensor offset, so they can be
   generated again to check the result;
2. converts HF -> MaxText with ``maxckpt.convert`` in a fresh process (the
   source's pages evicted first, output fsynced), then deletes the source;
3. converts that MaxText checkpoint -> HF likewise, then deletes it;
4. compares every tensor of the HF output, byte for byte, with the values of
   step 1 generated again (names, dtypes and shapes too), and deletes it.

It reports MB/s (model bytes / seconds) and peak RSS (the converting
process's ``ru_maxrss``) each way against the goal (``--rss-goal``, 3 GB), and
whether the round trip was bit-exact. The disk needs about twice ``--size``
free: the script refuses to start with less.

    python benchmarks/beyond_ram.py --json results/beyond_ram.json             # every layout, RAM + 5%
    python benchmarks/beyond_ram.py --layouts deepseek --size 2 --work /data   # one layout, 2 GB
    python benchmarks/beyond_ram.py --dims tiny --size 0.01                    # tiny widths (the tests)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import machine  # noqa: E402 - benchmarks/machine.py: the environment of a benchmarked process

BF16 = np.dtype(ml_dtypes.bfloat16)
POOL = 1 << 25  # values in the pool (64 MiB of bf16)
SHARD = 4 << 30  # bytes per safetensors shard (at most; a larger tensor gets its own)
PIECE = 1 << 24  # elements per write or compare
RSS_GOAL = 3e9
MODELS = {"dense": "llama2", "mixtral": "mixtral", "deepseek": "deepseek3"}


def base_spec(layout: str, dims: str):
    """The layout's ModelSpec with one layer (layers are set from the size); `dims` "full" or "tiny"."""
    from maxckpt.conversion.spec import family_defaults
    from maxckpt.families import FAMILIES
    from maxckpt.layouts.base import ModelSpec

    family = MODELS[layout]
    values = family_defaults(FAMILIES[family])
    tiny = dims == "tiny"
    if layout == "dense":  # llama2-13b
        emb, heads, kv, head_dim, mlp, vocab = (64, 4, 4, 16, 128, 256) if tiny else (5120, 40, 40, 128, 13824, 32000)
        return ModelSpec(family, 1, emb, heads, kv, head_dim, mlp, vocab, **values)
    if layout == "mixtral":  # mixtral-8x7b
        emb, heads, kv, head_dim, mlp, vocab = (64, 4, 2, 16, 96, 256) if tiny else (4096, 32, 8, 128, 14336, 32000)
        values.update(num_experts=4 if tiny else 8, moe_mlp_dim=mlp, num_experts_per_tok=2)
        return ModelSpec(family, 1, emb, heads, kv, head_dim, mlp, vocab, **values)
    # deepseek: DeepSeek-V3's structure at DeepSeek-V2-Lite-like widths
    if tiny:
        emb, heads, mlp, vocab, experts, moe_mlp = 64, 2, 64, 256, 4, 32
        mla = {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
    else:
        emb, heads, mlp, vocab, experts, moe_mlp = 2048, 16, 10944, 102400, 64, 1408
        mla = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    values.update(num_experts=experts, moe_mlp_dim=moe_mlp, num_experts_per_tok=2 if tiny else 6, num_shared_experts=2,
                  first_dense_layers=1, n_group=1, topk_group=1, **mla)
    head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    return ModelSpec(family, 2, emb, heads, heads, head_dim, mlp, vocab, **values)


def dtype_of(name: str) -> np.dtype:
    """bf16 like a released checkpoint, but DeepSeek's routing bias, which HF keeps in float32."""
    return np.dtype(np.float32) if name.endswith("e_score_correction_bias") else BF16


def tensors_of(spec) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    from maxckpt.formats.hf import layout as hfl

    return {name: (tuple(shape), dtype_of(name)) for name, shape in hfl.expected_tensors(spec).items()}


def model_bytes(spec) -> int:
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in tensors_of(spec).values())


def spec_for(layout: str, dims: str, size_bytes: float):
    """The layout with the fewest layers whose bytes exceed `size_bytes`."""
    spec = base_spec(layout, dims)
    low = spec.num_layers
    one, two = model_bytes(replace(spec, num_layers=low)), model_bytes(replace(spec, num_layers=low + 1))
    layers = max(low, low + math.ceil((size_bytes - one) / (two - one)))
    return replace(spec, num_layers=layers)


# ------------------------------------------------------------- the values, generated again on demand


class Values:
    """Every tensor's values: the pool read cyclically from an offset that depends on the tensor's position.

    The pool holds `size` values (a tiny model needs fewer: building 64 MiB of them takes seconds).
    """

    def __init__(self, size: int = POOL) -> None:
        self.size = size
        pool = (np.random.default_rng(0).standard_normal(size, dtype=np.float32) * 0.02).astype(BF16)
        self.bits = {BF16: pool.view(np.uint16), np.dtype(np.float32): pool.astype(np.float32).view(np.uint32)}

    def pieces(self, index: int, dtype: np.dtype, start: int, stop: int) -> Iterator[np.ndarray]:
        """Elements [start, stop) of tensor `index` as raw unsigned ints, in contiguous pieces."""
        bits = self.bits[dtype]
        at = (index * 2654435761 + start) % self.size
        left = stop - start
        while left:
            take = min(left, self.size - at)
            yield bits[at : at + take]
            left -= take
            at = 0


def build_hf(root: Path, spec, values: Values) -> dict:
    """Write the HF checkpoint shard by shard, each tensor in pieces (never one whole tensor in memory)."""
    from maxckpt.formats.hf.config import config_json

    root.mkdir(parents=True)
    tensors = tensors_of(spec)
    shards: list[list[str]] = [[]]
    used = 0
    for name, (shape, dtype) in tensors.items():
        nbytes = math.prod(shape) * dtype.itemsize
        if shards[-1] and used + nbytes > SHARD:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    order = {name: i for i, name in enumerate(tensors)}
    weight_map = {}
    start = time.perf_counter()
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in names:
            shape, dtype = tensors[name]
            nbytes = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": "BF16" if dtype == BF16 else "F32", "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(root / file, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for name in names:
                shape, dtype = tensors[name]
                for piece in values.pieces(order[name], dtype, 0, math.prod(shape)):
                    f.write(piece)
            os.fsync(f.fileno())
    total = sum(math.prod(s) * d.itemsize for s, d in tensors.values())
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=2))
    (root / "config.json").write_text(json.dumps(config_json(spec, BF16), indent=2))
    return {"seconds": time.perf_counter() - start, "bytes": total, "shards": len(shards), "tensors": len(tensors)}


def _headers(root: Path) -> dict[str, tuple[Path, int, dict]]:
    """name -> (file, data start, header entry) for every tensor of an HF folder."""
    out = {}
    for file in sorted(root.glob("*.safetensors")):
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        for name, entry in header.items():
            out[name] = (file, 8 + n, entry)
    return out


def compare_hf(root: Path, spec, values: Values) -> dict:
    """Every tensor of `root` byte for byte against the values build_hf wrote (and the same names, dtypes, shapes)."""
    tensors = tensors_of(spec)
    found = _headers(root)
    problems = []
    if set(found) != set(tensors):
        problems.append(f"names differ: missing {sorted(set(tensors) - set(found))[:3]}, "
                        f"extra {sorted(set(found) - set(tensors))[:3]}")
    checked = 0
    start = time.perf_counter()
    for index, (name, (shape, dtype)) in enumerate(tensors.items()):
        if name not in found:
            continue
        file, base, entry = found[name]
        want_dtype = "BF16" if dtype == BF16 else "F32"
        if entry["dtype"] != want_dtype or tuple(entry["shape"]) != shape:
            problems.append(f"{name}: {entry['dtype']} {entry['shape']}, expected {want_dtype} {list(shape)}")
            continue
        count = math.prod(shape)
        lo = entry["data_offsets"][0]
        with open(file, "rb", buffering=0) as f:
            for a in range(0, count, PIECE):
                b = min(count, a + PIECE)
                got = np.frombuffer(os.pread(f.fileno(), (b - a) * dtype.itemsize, base + lo + a * dtype.itemsize),
                                    dtype=values.bits[dtype].dtype)
                want = np.concatenate(list(values.pieces(index, dtype, a, b)))
                if got.shape != want.shape or not np.array_equal(got, want):
                    problems.append(f"{name}: elements {a}..{b} differ from the source's")
                    break
        checked += 1
    return {"seconds": time.perf_counter() - start, "tensors_checked": checked, "problems": problems[:10],
            "bit_exact": not problems}


# ------------------------------------------------------------------------------------ the run


def ram_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def evict(path: Path) -> None:
    """Drop `path`'s files from the page cache, so the conversion reads from the disk (dirty pages flushed first)."""
    for f in [p for p in path.rglob("*") if p.is_file()]:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def convert_in_process(src: Path, dst: Path, to: str, model: str, overrides: dict) -> dict:
    """benchmarks/convert.py's maxckpt worker: convert() in a fresh process, output fsynced, its ru_maxrss.

    `overrides`: what a MaxText source cannot say (the routing top-k), as `maxckpt convert --set` gives it.
    """
    evict(src)
    cmd = [sys.executable, str(HERE / "convert.py"), "--worker", "maxckpt", "--src", str(src), "--dst", str(dst),
           "--to", to, "--model", model, "--overrides-json", json.dumps(overrides)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=machine.installed_env({**os.environ, "JAX_PLATFORMS": "cpu"}))
    if proc.returncode != 0:
        raise RuntimeError(f"maxckpt convert {src} -> {to} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_layout(layout: str, args, work: Path, values: Values, console) -> list[dict]:
    spec = spec_for(layout, args.dims, args.size * 1e9 if args.size else 1.05 * ram_bytes())
    size = model_bytes(spec)
    free = shutil.disk_usage(work).free
    if free < 2 * size + 1e9:
        raise SystemExit(f"error: {layout} needs about {2 * size / 1e9:.1f} GB free under {work} (two copies at once); "
                         f"{free / 1e9:.1f} GB are: free some or pass --work on a larger disk")
    case = work / layout
    shutil.rmtree(case, ignore_errors=True)
    model = MODELS[layout]
    common = {"layout": layout, "model": model, "layers": spec.num_layers, "model_bytes": size, "ram_bytes": ram_bytes(),
              "rss_goal": args.rss_goal, "cpus": os.cpu_count()}
    rows = []
    try:
        console.print(f"[bold]{layout}[/] ({model}, {spec.num_layers} layers): writing {size / 1e9:.2f} GB of HF safetensors ...")
        built = build_hf(case / "hf", spec, values)
        console.print(f"  written in {built['seconds']:.0f} s ({built['shards']} shards, {built['tensors']} tensors); "
                      "hf -> maxtext ...")
        top_k = {"num_experts_per_tok": spec.num_experts_per_tok} if spec.num_experts else {}
        to_mt = convert_in_process(case / "hf", case / "maxtext", "maxtext", model, top_k)
        mt_bytes = _disk_bytes(case / "maxtext")
        shutil.rmtree(case / "hf")
        console.print(f"  {to_mt['seconds']:.0f} s, peak RSS {to_mt['peak_rss'] / 1e6:.0f} MB; maxtext -> hf ...")
        to_hf = convert_in_process(case / "maxtext", case / "back", "hf", model, top_k)
        shutil.rmtree(case / "maxtext")
        console.print(f"  {to_hf['seconds']:.0f} s, peak RSS {to_hf['peak_rss'] / 1e6:.0f} MB; comparing every tensor ...")
        check = compare_hf(case / "back", spec, values)
        for direction, run, out_bytes in (("hf -> maxtext", to_mt, mt_bytes), ("maxtext -> hf", to_hf, None)):
            rows.append({**common, "direction": direction, "seconds": run["seconds"], "peak_rss": run["peak_rss"],
                         "cpu": run["cpu"], "mb_per_s": size / 1e6 / run["seconds"], "build": built,
                         "output_bytes": out_bytes if out_bytes is not None else _disk_bytes(case / "back"),
                         "rss_met": run["peak_rss"] <= args.rss_goal})
        rows[-1].update(bit_exact=check["bit_exact"], tensors_checked=check["tensors_checked"],
                        problems=check["problems"], compare_seconds=check["seconds"])
    finally:
        shutil.rmtree(case, ignore_errors=True)
    return rows


def show(rows: list[dict], console) -> None:
    from rich.table import Table

    load = os.getloadavg()
    table = Table(title=f"beyond RAM: synthetic bf16 checkpoints larger than this machine's {rows[0]['ram_bytes'] / 1e9:.1f} GB "
                  f"of RAM, both ways, {rows[0]['cpus']} cores (load average now {load[0]:.1f}); goal: peak RSS <= "
                  f"{rows[0]['rss_goal'] / 1e9:g} GB, bit-exact round trip", title_justify="left")
    for col in ("layout", "layers", "model", "direction", "seconds", "MB/s", "CPU s", "peak RSS", "RSS goal met",
                "round trip bit-exact"):
        table.add_column(col, justify="right")
    for r in rows:
        exact = "" if "bit_exact" not in r else (f"yes ({r['tensors_checked']} tensors)" if r["bit_exact"]
                                                 else "[red]no[/]: " + "; ".join(r["problems"][:2]))
        table.add_row(f"{r['layout']} ({r['model']})", str(r["layers"]), f"{r['model_bytes'] / 1e9:.2f} GB", r["direction"],
                      f"{r['seconds']:.1f}", f"{r['mb_per_s']:.0f}", f"{r['cpu']:.0f}", f"{r['peak_rss'] / 1e6:.0f} MB",
                      "yes" if r["rss_met"] else "[red]no[/]", exact)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="dense,mixtral,deepseek", help="comma-separated: dense, mixtral, deepseek")
    parser.add_argument("--size", type=float, default=None, help="GB each checkpoint exceeds (default: this machine's RAM + 5%%)")
    parser.add_argument("--dims", choices=("full", "tiny"), default="full", help="the layouts' widths (tiny: for tests)")
    parser.add_argument("--rss-goal", type=float, default=RSS_GOAL, help="peak RSS goal in bytes (default 3e9)")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir; needs ~2x --size)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    unknown = [x for x in layouts if x not in MODELS]
    if unknown:
        parser.error(f"unknown layout {unknown[0]!r}; choose from {', '.join(MODELS)}")
    console = Console(width=max(160, Console().width))
    work = Path(tempfile.mkdtemp(prefix="maxckpt-beyond-ram-", dir=args.work))
    values = Values(POOL if args.dims == "full" else 1 << 16)
    rows: list[dict] = []
    try:
        for layout in layouts:
            rows += run_layout(layout, args, work, values, console)
            if args.json:  # after each layout: a long run keeps what it measured
                args.json.write_text(json.dumps(rows, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    show(rows, console)
    return 0 if all(r["rss_met"] and r.get("bit_exact", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
