"""Check that a refactor leaves every conversion's output byte-identical (issue 23, "Done when").

Every MaxText fixture in shared/fixtures/maxtext goes through the public CLI (`python -m maxckpt.cli.main
convert`) to hf, megatron (--megatron-spec te and local), torchtitan and torch, each of those back to maxtext,
and that hf -> maxtext output on to hf again; MaxText's own HF exports (hf_by_maxtext/) go to maxtext and back
to hf. The same list runs under two codes, each in its own subprocesses with the same interpreter and
PYTHONPATH=<checkout> (every conversion asserts `maxckpt.__file__` lies in its checkout, so the editable install
never stands in): a clean clone of --base, and the working tree (or a clone of --head). Every output file is
hashed (sha256, by path relative to the conversion's DST) and the two sides compared. Both sides write to the
same absolute paths (one side's outputs are moved aside before the next starts), so paths recorded inside files
compare too.

The base side runs twice first: a file that differs between those two runs after NORMALIZED is
non-determinism the table does not cover yet, and the check fails (exit 2) instead of blaming the head.
Pairs the base refuses (megatron <-> gemma2, torchtitan <-> mixtral, families the base does not know) are
listed as skipped with their error's first line; a pair only one side refuses counts as a difference.

    python benchmarks/identical_outputs.py --base 39cbaf6                  # base vs the working tree
    python benchmarks/identical_outputs.py --base 39cbaf6 --head 39cbaf6   # proves determinism and NORMALIZED
    python benchmarks/identical_outputs.py --base main~3 --head main --out identity.json --keep /tmp/ident

Exit status: 0 all identical, 1 some file or outcome differs, 2 the base is not deterministic.

Measured 2026-12-02 on 2 cores shared with other test runs (load 3-8), `--base 39cbaf6 --head 39cbaf6
--base-runs 1`: 308 conversions listed, 143 run on each side, 165 skipped on both (76 refused, 89 whose source
was refused), 4,713 files compared, all identical; 2,008 s wall (1,108 s and 888 s per side; 1-2 s a
conversion on an idle machine, 5-25 s under load). Refused by 39cbaf6: megatron and torchtitan for gemma2 and
gemma3, torchtitan for mixtral, every target of the 13 runs whose family it has no mapping for (qwen2.5, gemma,
gemma4 x4, llama4, deepseek2, deepseek3.2, kimi-k2, olmo3, qwen3-next, qwen3.5), and MaxText's HF exports of
qwen2.5, deepseek2, deepseek3.2 (model types it does not read) and deepseek3 (n_group 8 with 4 experts).
2026-12-03, `--base f234dda --head c18707b --base-runs 1` (MaxText's tables lifted into the mapping
vocabulary): 217 conversions run on each side, 91 skipped on both, 7,703 files compared, all identical; 569 s
wall on an idle machine. Checked to fail where it should: `--base eaeb4b6~1 --head eaeb4b6 --only llama2_scan_params` names the five
config.json and common.pt files that commit changed (maxckpt_assumed_settings).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("MAXCKPT_FIXTURES", REPO.parent / "shared" / "fixtures")) / "maxtext"

# (fixture run, MaxText model_name, --set settings): what shared/fixtures/README.md says each run was trained
# with that no tensor shape shows. The tiny MoE runs route to 2 of 4 experts (llama4: 1), which no preset does.
MAXTEXT_FIXTURES: list[tuple[str, str, dict[str, object]]] = [
    ("llama2_scan", "llama2-7b", {}),
    ("llama2_scan_params", "llama2-7b", {}),
    ("llama31_scan_params", "llama3.1-8b", {}),
    ("llama3_scan", "llama3-8b", {}),
    ("mistral_scan", "mistral-7b", {}),
    ("qwen3_scan", "qwen3-0.6b", {}),
    ("qwen3_8b_scan", "qwen3-8b", {}),
    ("qwen2_5_scan", "qwen2.5-7b", {}),
    ("mixtral_moe_scan", "mixtral-8x7b", {}),
    ("qwen3_moe_scan", "qwen3-30b-a3b", {"num_experts_per_tok": 2}),
    ("deepseek3_scan", "deepseek3-671b", {"num_experts_per_tok": 2}),
    ("deepseek2_scan", "deepseek2-16b", {"num_experts_per_tok": 2}),
    ("deepseek32_scan", "deepseek3.2-671b", {"num_experts_per_tok": 2}),
    ("kimi_k2_scan", "kimi-k2-1t", {"num_experts_per_tok": 2}),
    ("gpt_oss_scan", "gpt-oss-20b", {"num_experts_per_tok": 2}),
    ("gemma_scan", "gemma-2b", {}),
    ("gemma2_scan", "gemma2-2b", {}),
    ("gemma3_scan", "gemma3-4b", {}),
    ("gemma4_scan", "gemma4-31b", {}),
    ("gemma4_scan_rem7", "gemma4-31b", {}),
    ("gemma4_moe_scan", "gemma4-26b", {"num_experts_per_tok": 2}),
    ("gemma4_e2b_unscan_a", "gemma4-e2b", {}),
    ("llama4_scan", "llama4-17b-16e", {"num_experts_per_tok": 1}),
    ("olmo3_scan", "olmo3-7b", {}),
    # The Gated DeltaNet key heads and width are folded into in_proj_qkvz with the values: shapes cannot tell them.
    ("qwen3_next_scan", "qwen3-next-80b-a3b", {"num_experts_per_tok": 2, "gdn_num_key_heads": 2, "gdn_key_head_dim": 8}),
    ("qwen3_5_scan", "qwen3.5-35b-a3b",
     {"num_experts_per_tok": 2, "gdn_num_key_heads": 2, "gdn_key_head_dim": 8, "mrope_section": [2, 1, 1]}),
]
# (output name, --to, extra flags): the targets every MaxText fixture goes to.
TARGETS: list[tuple[str, str, list[str]]] = [
    ("hf", "hf", []),
    ("megatron_te", "megatron", ["--megatron-spec", "te"]),
    ("megatron_local", "megatron", ["--megatron-spec", "local"]),
    ("torchtitan", "torchtitan", []),
    ("torch", "torch", []),
]


@dataclass(frozen=True)
class Conversion:
    """One `maxckpt convert` call: its name (also its DST under the side's output root) and arguments.

    `src` is a fixture path or the name of an earlier conversion whose output it reads.
    """

    name: str
    src: str
    to: str
    flags: tuple[str, ...] = ()
    after: str | None = None  # the conversion whose output is `src`, if any


def maxtext_flags(model: str, settings: dict[str, object]) -> tuple[str, ...]:
    """A MaxText source's --model and --set flags (shapes cannot tell rotary, top-k, softcaps)."""
    flags = ["--model", model]
    for key, value in settings.items():
        flags += ["--set", f"{key}={json.dumps(value)}"]
    return tuple(flags)


def conversions(fixtures: Path, only: list[str] | None = None) -> list[Conversion]:
    """The full list, in an order where every conversion's source is written before it runs.

    MaxText sources get the fixture's --model/--set; every other source is read from what it records
    (config.json, maxckpt_model.json), as a user hands an export back.
    """
    out: list[Conversion] = []
    for run, model, settings in MAXTEXT_FIXTURES:
        if only and run not in only:
            continue
        mt = maxtext_flags(model, settings)
        src = str(fixtures / run / "checkpoints")
        for target, to, extra in TARGETS:
            out.append(Conversion(f"{run}/{target}", src, to, mt + tuple(extra)))
        for target, _, _ in TARGETS:
            out.append(Conversion(f"{run}/{target}-maxtext", f"{run}/{target}", "maxtext", (), after=f"{run}/{target}"))
        out.append(Conversion(f"{run}/hf-maxtext-hf", f"{run}/hf-maxtext", "hf", mt, after=f"{run}/hf-maxtext"))
    exports = fixtures / "hf_by_maxtext"
    for export in sorted(p.name for p in exports.iterdir() if p.is_dir()) if exports.is_dir() else []:
        if only and export not in only and f"hf_by_maxtext/{export}" not in only:
            continue
        model, settings = next(((m, s) for r, m, s in MAXTEXT_FIXTURES if r == export), (None, {}))
        back = maxtext_flags(model, settings) if model else ()
        name = f"hf_by_maxtext/{export}"
        out.append(Conversion(f"{name}/maxtext", str(exports / export), "maxtext", ()))
        out.append(Conversion(f"{name}/maxtext-hf", f"{name}/maxtext", "hf", back, after=f"{name}/maxtext"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# What may differ between two runs of the same code, and how it is compared instead. Each entry: a glob on the
# path relative to DST, the normaliser, and why. Nothing here drops tensor bytes: OCDBT chunks are compared by key.


def _orbax_step_metadata(path: Path, dst: Path) -> bytes:
    data = json.loads(path.read_text())
    for key in ("init_timestamp_nsecs", "commit_timestamp_nsecs"):
        if key in data:
            data[key] = "<timestamp>"
    return json.dumps(data, sort_keys=True).encode()


def _dcp_metadata(path: Path, dst: Path) -> bytes:
    import pickle

    import torch.distributed.checkpoint.metadata  # noqa: F401  (the classes the pickle names)

    with path.open("rb") as f:
        meta = pickle.load(f)
    storage = getattr(meta, "storage_meta", None)
    if storage is not None:
        storage.save_id = "<uuid>"
        if storage.checkpoint_id is not None:  # <DST's folder>/<DST>.tmp-<random>/<DST>/...: keep what follows
            where = str(storage.checkpoint_id)
            if where.startswith(str(dst.parent) + "/"):
                where = "<dst folder>" + where[len(str(dst.parent)):]
            storage.checkpoint_id = re.sub(r"\.tmp-[^/]+", ".tmp-<random>", where)
    return pickle.dumps(meta, protocol=4)


@dataclass(frozen=True)
class Normalizer:
    """One kind of file whose raw bytes legitimately change from run to run, and what is hashed instead."""

    pattern: str
    reason: str
    normalize: Callable[[Path, Path], bytes]  # (file, the conversion's DST) -> the bytes hashed instead


NORMALIZED: list[Normalizer] = [
    Normalizer("*_CHECKPOINT_METADATA", "Orbax step metadata: init/commit wall-clock timestamps (rest compared)",
               _orbax_step_metadata),
    Normalizer("*.metadata", "PyTorch DCP metadata: storage_meta.save_id is a fresh uuid4 and checkpoint_id the "
               "random staging dir DST.tmp-* under DST's absolute folder; both masked (the path below DST kept), every "
               "tensor entry compared", _dcp_metadata),
]
OCDBT_PATTERN = "<folder holding manifest.ocdbt>/{manifest.ocdbt,d/*,ocdbt.process_*/}"
OCDBT_REASON = ("Orbax OCDBT: data files d/* get random names and chunks land in them in thread order, so their "
                "bytes and manifest.ocdbt's b-tree differ per run; compared instead as the database's key -> "
                "value bytes (every zarr.json and every stored chunk, exact), read through TensorStore")


def _ocdbt_entries(root: Path) -> Iterator[tuple[str, str]]:
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{root.resolve()}/"}).result()
    for key in sorted(kv.list().result()):
        value = kv.read(key).result().value
        yield key.decode("utf-8", "backslashreplace"), hashlib.sha256(value).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_output(dst: Path) -> dict[str, str]:
    """`relative path -> sha256` of everything a conversion wrote, NORMALIZED applied.

    Files of an OCDBT database (a folder holding manifest.ocdbt: the manifest, d/*, ocdbt.process_*/) become
    one entry per key, `<db folder>/ocdbt:<key>`.
    """
    if dst.is_file():
        return {".": _sha256(dst)}
    out: dict[str, str] = {}
    ocdbt_roots = sorted({p.parent for p in dst.rglob("manifest.ocdbt")}, key=lambda p: len(p.parts))
    top_roots = [r for r in ocdbt_roots if not any(o != r and o in r.parents for o in ocdbt_roots)]
    for root in top_roots:
        rel = root.relative_to(dst).as_posix()
        for key, digest in _ocdbt_entries(root):
            out[f"{rel}/ocdbt:{key}"] = digest
    for path in sorted(dst.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(dst).as_posix()
        in_db = next((r for r in top_roots if r in path.parents), None)
        if in_db is not None:
            inner = path.relative_to(in_db).as_posix()
            if inner == "manifest.ocdbt" or inner.startswith(("d/", "ocdbt.process_")):
                continue
        rule = next((n for n in NORMALIZED if fnmatch.fnmatch(rel, n.pattern)), None)
        if rule is not None:
            out[rel] = hashlib.sha256(rule.normalize(path, dst)).hexdigest()
        else:
            out[rel] = _sha256(path)
    return out


# ---------------------------------------------------------------------------------------------------------------
# One side: a checkout, its outputs, its results.

# Runs the CLI exactly as `python -m maxckpt.cli.main` does, after checking which maxckpt the process imports.
RUNNER = (
    "import os, runpy, sys\n"
    "root = os.path.realpath(sys.argv.pop(1))\n"
    "import maxckpt\n"
    "where = os.path.realpath(maxckpt.__file__)\n"
    "if not where.startswith(root + os.sep):\n"
    "    sys.exit(f'identical_outputs: imported {where}, not the checkout {root}')\n"
    "sys.argv[0] = 'maxckpt'\n"
    "runpy.run_module('maxckpt.cli.main', run_name='__main__', alter_sys=True)\n"
)


@dataclass
class Outcome:
    """What one conversion did on one side."""

    ok: bool
    seconds: float
    error: str = ""
    files: dict[str, str] = field(default_factory=dict)


def error_line(stderr: str) -> str:
    """The first line of the CLI's `error:` message, else the traceback's last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("error:", "identical_outputs:")):
            return line
    return lines[-1] if lines else "(no output)"


def run_side(label: str, code: Path, convs: list[Conversion], out_root: Path, timeout: float) -> dict[str, Outcome]:
    """Run every conversion with PYTHONPATH=code, one process each, writing under out_root (fresh)."""
    if out_root.exists():
        shutil.rmtree(out_root)
    out_root.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(code)}
    results: dict[str, Outcome] = {}
    for i, conv in enumerate(convs, 1):
        prefix = f"[{label} {i:>3}/{len(convs)}] {conv.name:<44}"
        if conv.after is not None and not (conv.after in results and results[conv.after].ok):
            results[conv.name] = Outcome(False, 0.0, f"source {conv.after} was not written")
            print(f"{prefix} skip (no source)", flush=True)
            continue
        src = str(out_root / conv.src) if conv.after is not None else conv.src
        dst = out_root / conv.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-c", RUNNER, str(code), "convert", src, str(dst), "--to", conv.to, "-q", *conv.flags]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=out_root, env=env, capture_output=True, text=True, timeout=timeout,
                                  check=False)
            rc, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            rc, stderr = -1, f"error: timed out after {timeout:.0f} s"
        seconds = time.perf_counter() - start
        if "identical_outputs: imported" in stderr:
            sys.exit(f"{label}: {error_line(stderr)}")
        if rc == 0:
            files = hash_output(dst)
            results[conv.name] = Outcome(True, seconds, files=files)
            print(f"{prefix} ok   {seconds:5.1f} s  {len(files)} files", flush=True)
        else:
            results[conv.name] = Outcome(False, seconds, error_line(stderr))
            print(f"{prefix} fail {seconds:5.1f} s  {results[conv.name].error[:110]}", flush=True)
    return results


def checkout(rev: str, where: Path) -> Path:
    """A clean clone of this repository at `rev` (its own maxckpt, none of the working tree's edits)."""
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "-q", rev], check=True)
    return where


def describe(code: Path) -> str:
    """`<commit>` of a checkout, plus `+dirty` when it has uncommitted changes to tracked files."""
    commit = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return commit + ("+dirty" if dirty else "")


def compare(a: dict[str, Outcome], b: dict[str, Outcome]) -> dict[str, object]:
    """Per-file and per-outcome differences between two sides' results (same conversion list)."""
    identical, differing, only_a, only_b, outcome, skipped = 0, [], [], [], [], []
    for name, ra in a.items():
        rb = b[name]
        if not ra.ok and not rb.ok:
            skipped.append({"conversion": name, "error": ra.error, **({"other_error": rb.error}
                                                                       if rb.error != ra.error else {})})
            continue
        if ra.ok != rb.ok:
            outcome.append({"conversion": name, "a": "ok" if ra.ok else ra.error, "b": "ok" if rb.ok else rb.error})
            continue
        for rel in sorted(set(ra.files) | set(rb.files)):
            path = f"{name}/{rel}"
            if rel not in rb.files:
                only_a.append(path)
            elif rel not in ra.files:
                only_b.append(path)
            elif ra.files[rel] == rb.files[rel]:
                identical += 1
            else:
                differing.append(path)
    compared = identical + len(differing) + len(only_a) + len(only_b)
    return {"files_compared": compared, "identical": identical, "differing": differing, "only_in_a": only_a,
            "only_in_b": only_b, "outcome_differs": outcome, "skipped": skipped}


def reused_base(summary: Path, base_code: str, convs: list[Conversion]) -> dict[str, Outcome]:
    """The base side of an earlier summary, refused when its base commit or conversion list differs."""
    data = json.loads(summary.read_text())
    if data.get("base_code") != base_code or set(data["per_conversion"]) != {c.name for c in convs}:
        sys.exit(f"--reuse-base {summary}: made from base {data.get('base_code')} and another conversion list; "
                 f"run the base again")
    out = {}
    for conv in convs:
        first = data["per_conversion"][conv.name]["base#1"]
        out[conv.name] = Outcome(first["ok"], first["seconds"], first.get("error", ""),
                                 data["base_files"].get(conv.name, {}))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status (0 identical, 1 differences, 2 base not deterministic)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="Revision before the change (cloned clean).")
    parser.add_argument("--head", help="Revision after it (cloned clean); default: this working tree as it is.")
    parser.add_argument("--out", type=Path, help="Write the JSON summary here.")
    parser.add_argument("--keep", type=Path, help="Keep checkouts and outputs in this folder (default: a temp dir).")
    parser.add_argument("--base-runs", type=int, default=2, help="Runs of the base side (2: check determinism).")
    parser.add_argument("--only", help="Comma-separated fixture names (e.g. llama2_scan,gemma2_scan), for a quick run.")
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds one conversion may take.")
    parser.add_argument("--reuse-base", type=Path, help="A summary JSON (--out) of an earlier run of the same --base "
                        "and list: take its base hashes instead of running the base again.")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="identical-outputs-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        base = checkout(args.base, work / "base-code")
        head = checkout(args.head, work / "head-code") if args.head else REPO
        convs = conversions(FIXTURES, args.only.split(",") if args.only else None)
        print(f"{len(convs)} conversions; base {args.base} ({describe(base)}) at {base}, "
              f"head {args.head or 'working tree'} ({describe(head)}) at {head}; outputs under {work}", flush=True)
        out_root = work / "out"  # every side writes here, then is moved aside: paths inside files match
        sides: dict[str, dict[str, Outcome]] = {}
        times: dict[str, float] = {}
        plan = [(f"base#{i + 1}", base) for i in range(max(1, args.base_runs))] + [("head", head)]
        if args.reuse_base:
            sides["base#1"] = reused_base(args.reuse_base, describe(base), convs)
            plan = [("head", head)]
            print(f"base#1: {len(sides['base#1'])} results from {args.reuse_base}", flush=True)
        for label, code in plan:
            t0 = time.perf_counter()
            sides[label] = run_side(label, code, convs, out_root, args.timeout)
            times[label] = round(time.perf_counter() - t0, 1)
            kept = work / label.replace("#", "")
            if kept.exists():
                shutil.rmtree(kept)
            if args.keep:
                out_root.rename(kept)
            else:
                shutil.rmtree(out_root)
        runs = sum(1 for label in sides if label.startswith("base#"))
        unstable = [compare(sides["base#1"], sides[f"base#{i + 1}"]) for i in range(1, runs)]
        result = compare(sides["base#1"], sides["head"])
        ran = sum(1 for name in sides["head"] if sides["base#1"][name].ok or sides["head"][name].ok)
        summary = {
            "base": args.base, "base_code": describe(base), "head": args.head or "working tree",
            "head_code": describe(head), "conversions": len(convs), "conversions_run": ran,
            "conversions_skipped": len(result["skipped"]), **result,
            "unstable_in_base": [u["differing"] + u["only_in_a"] + u["only_in_b"] + u["outcome_differs"]
                                 for u in unstable],
            "normalized": [{"pattern": n.pattern, "reason": n.reason} for n in NORMALIZED]
            + [{"pattern": OCDBT_PATTERN, "reason": OCDBT_REASON}],
            "seconds_per_side": times, "wall_s": round(time.perf_counter() - start, 1),
            "per_conversion": {name: {side: {"ok": r[name].ok, "seconds": round(r[name].seconds, 2),
                                             **({"error": r[name].error} if r[name].error else {})}
                                      for side, r in sides.items()} for name in sides["head"]},
            "base_files": {name: r.files for name, r in sides["base#1"].items() if r.ok},
        }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nskipped (refused or failed on both sides): {len(result['skipped'])}")
    for s in result["skipped"]:
        print(f"  {s['conversion']}: {s['error'][:140]}")
    status = 0
    for i, u in enumerate(summary["unstable_in_base"], 2):
        if u:
            status = 2
            print(f"\nNOT DETERMINISTIC: base#1 vs base#{i} differ in {len(u)} entries (extend NORMALIZED):")
            for entry in u[:50]:
                print(f"  {entry}")
    bad = result["differing"] + result["only_in_a"] + result["only_in_b"]
    if bad or result["outcome_differs"]:
        status = status or 1
    print(f"\nconversions: {len(convs)} listed, {ran} run, {len(result['skipped'])} skipped on both sides")
    print(f"files compared: {result['files_compared']}, identical: {result['identical']}, "
          f"differing: {len(result['differing'])}, only in base: {len(result['only_in_a'])}, "
          f"only in head: {len(result['only_in_b'])}, outcome differs: {len(result['outcome_differs'])}")
    for path in result["differing"]:
        print(f"  differs: {path}")
    for path in result["only_in_a"]:
        print(f"  only in base: {path}")
    for path in result["only_in_b"]:
        print(f"  only in head: {path}")
    for o in result["outcome_differs"]:
        print(f"  outcome: {o['conversion']}: base {o['a'][:100]} / head {o['b'][:100]}")
    print(f"wall time: {summary['wall_s']:.0f} s (per side: {times})")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
        print(f"summary: {args.out}")
    print("ALL IDENTICAL" if status == 0 else ("BASE NOT DETERMINISTIC" if status == 2 else "DIFFERENCES FOUND"))
    return status


if __name__ == "__main__":
    sys.exit(main())
