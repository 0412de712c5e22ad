"""maxckpt against MaxText 0.2.5's own converters, on the same checkpoint, in one run.

Why: "faster than MaxText's converter at a fraction of its memory" is a claim
users check. Both tools run as a user runs them - a whole command, imports
included - each in its own process; wall time and peak RSS (``ru_maxrss`` of
that process, from ``os.wait4``) and CPU time (user + system, all threads) are
taken from the parent, the output fsynced (``os.sync``) inside the timed span;
the faster of ``--repeats`` runs counts, for both tools alike. maxckpt runs
from bytecode compiled beforehand, as an installed package does (MaxText's
venv has its .pyc files; benchmarks/machine.py installed_env).

1. A synthetic HF llama3.1 checkpoint (bf16, ``--dims``; default 191.5M
   parameters: emb 576, 9 heads of 64, 3 kv heads, mlp 2304, 9 layers,
   llama3.1's 128256-token vocabulary) is written, streamed, by
   benchmarks/beyond_ram.py's writer, with the tokenizer files of the
   fixture MaxText exported (shared/fixtures/maxtext/hf_by_maxtext).
2. HF -> MaxText: MaxText's ``maxtext.checkpoint_conversion.to_maxtext`` (its
   defaults: lazy loading, bf16, 16 simulated CPU devices; its HF config
   table resized to the model by benchmarks/maxtext_resized.py, as
   to_huggingface's ``--override_model_architecture`` does) against
   ``maxckpt convert --to maxtext``, from that HF folder.
3. MaxText -> HF: MaxText's ``to_huggingface`` (``weight_dtype=bfloat16``,
   ``--override_model_architecture``, the tokenizer from the same folder)
   against ``maxckpt convert --to hf``, both from the checkpoint MaxText's
   ``to_maxtext`` wrote in step 2 - a MaxText-written checkpoint.

The goals (issue 27): maxckpt >= 7x faster both ways, at peak RSS <= 2 x
the largest tensor + 300 MB. MaxText runs in its Python 3.12 venv
(tests/maxtext_env.py builds it once; ``$MAXCKPT_MAXTEXT_VENV_CACHE``).

    python benchmarks/vs_maxtext.py --json results/vs_maxtext.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import beyond_ram  # noqa: E402 - benchmarks/beyond_ram.py: the streamed HF writer
import machine  # noqa: E402 - benchmarks/machine.py: maxckpt run from bytecode, as installed

SPEEDUP_GOAL = 7.0
TOKENIZER = Path("/work/shared/fixtures/maxtext/hf_by_maxtext/llama31_from_params")
MAXTEXT_MODEL = "llama3.1-8b"
DIMS = {  # name -> (emb, heads, kv heads, head dim, mlp, layers, vocab)
    "191m": (576, 9, 3, 64, 2304, 9, 128256),
    "tiny": (64, 4, 2, 16, 128, 2, 256),
}


def spec_for(dims: str):
    from maxckpt.conversion.spec import family_defaults
    from maxckpt.families import FAMILIES
    from maxckpt.layouts.base import ModelSpec

    emb, heads, kv, head_dim, mlp, layers, vocab = DIMS[dims]
    return ModelSpec("llama3.1", layers, emb, heads, kv, head_dim, mlp, vocab, **family_defaults(FAMILIES["llama3.1"]))


def maxtext_keys(spec) -> list[str]:
    """The MaxText config keys that give MaxText the same model (overriding llama3.1-8b's sizes)."""
    return [f"model_name={MAXTEXT_MODEL}", "override_model_config=true", f"base_emb_dim={spec.emb_dim}",
            f"base_num_query_heads={spec.num_heads}", f"base_num_kv_heads={spec.num_kv_heads}",
            f"head_dim={spec.head_dim}", f"base_mlp_dim={spec.mlp_dim}", f"base_num_decoder_layers={spec.num_layers}",
            f"vocab_size={spec.vocab_size}", "scan_layers=true", "hardware=cpu", "skip_jax_distributed_system=true",
            "per_device_batch_size=1", "max_target_length=16", "enable_goodput_recording=false", "run_name=convert"]


def hf_sizes(spec) -> dict:
    """The HF config attributes to_maxtext takes from its own table (benchmarks/maxtext_resized.py sets them)."""
    return {"num_hidden_layers": spec.num_layers, "hidden_size": spec.emb_dim, "intermediate_size": spec.mlp_dim,
            "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
            "vocab_size": spec.vocab_size}


# Linux starts a process's ru_maxrss at the peak RSS of the process that exec'd it (exec_mmap keeps the old
# mm's high-water mark), so a command spawned straight from a large parent (a pytest run, a benchmark holding
# a checkpoint) reports the parent's peak. A bare interpreter spawns it instead and reports its rusage.
_LAUNCHER = """import json, os, sys
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump({"peak_rss": usage.ru_maxrss * 1024, "cpu": usage.ru_utime + usage.ru_stime}, out)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def measured(cmd: list[str], env: dict[str, str], log: Path) -> dict:
    """Run `cmd` in its own process: wall seconds (output synced), its own peak RSS and CPU seconds (os.wait4 in
    a small launcher process, so that the peak is the command's, not the caller's)."""
    usage_file = log.with_name(log.name + ".rusage.json")
    launcher = [sys.executable, "-S", "-c", _LAUNCHER, str(usage_file), *cmd]
    with open(log, "w") as out:
        start = time.perf_counter()
        code = subprocess.run(launcher, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
        os.sync()
        seconds = time.perf_counter() - start
    if code != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {code} (log {log}):\n{tail}")
    usage = json.loads(usage_file.read_text())
    return {"seconds": seconds, "peak_rss": usage["peak_rss"], "cpu": usage["cpu"], "command": cmd}


def best_of(repeats: int, cmd: list[str], env: dict[str, str], log: Path, output: Path) -> dict:
    """The fastest of `repeats` runs (`output` removed before each; the last one's is kept), every run's seconds too."""
    runs = []
    for _ in range(repeats):
        shutil.rmtree(output, ignore_errors=True)
        runs.append(measured(cmd, env, log))
    best = min(runs, key=lambda r: r["seconds"])
    return {**best, "all_seconds": [r["seconds"] for r in runs], "all_peak_rss": [r["peak_rss"] for r in runs]}


def largest_tensor(spec) -> int:
    return max(math.prod(shape) * dtype.itemsize for shape, dtype in beyond_ram.tensors_of(spec).values())


def run(args, work: Path, console) -> list[dict]:
    sys.path.insert(0, str(REPO / "tests"))
    from maxtext_env import maxtext_python, run_env

    spec = spec_for(args.dims)
    params = sum(math.prod(shape) for shape, _ in beyond_ram.tensors_of(spec).values())
    hf = work / "hf"
    console.print(f"writing a {params / 1e6:.1f}M-parameter llama3.1 HF checkpoint (bf16) ...")
    beyond_ram.build_hf(hf, spec, beyond_ram.Values())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(args.tokenizer / name, hf / name)
    python = str(maxtext_python())
    mt_env = {**run_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    ours_env = machine.installed_env({**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)})
    # compiled once, untimed, as pip does at install time (MaxText's venv was installed so)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "maxckpt")], env=ours_env, check=True,
                   capture_output=True)
    maxckpt = [sys.executable, "-m", "maxckpt", "convert"]
    base_yml = str(next(Path(python).parent.parent.glob("lib/python3*/site-packages/maxtext/configs/base.yml")))
    keys = maxtext_keys(spec)
    rows = []
    # HF -> MaxText
    console.print("HF -> MaxText: MaxText's to_maxtext ...")
    theirs_mt = work / "maxtext-by-maxtext"
    n = args.repeats
    theirs = best_of(n, [python, str(HERE / "maxtext_resized.py"), json.dumps(hf_sizes(spec)), MAXTEXT_MODEL,
                         "maxtext.checkpoint_conversion.to_maxtext", base_yml, *keys,
                         f"base_output_directory={theirs_mt}", f"hf_model_path={hf}"], mt_env, work / "to_maxtext.log",
                     theirs_mt)
    console.print(f"  {theirs['seconds']:.1f} s, {theirs['peak_rss'] / 1e6:.0f} MB; maxckpt ...")
    ours = best_of(n, [*maxckpt, str(hf), str(work / "maxtext-by-maxckpt"), "--to", "maxtext", "--model", "llama3.1",
                       "-q"], ours_env, work / "maxckpt-to-maxtext.log", work / "maxtext-by-maxckpt")
    rows.append({"direction": "hf -> maxtext", "maxtext": theirs, "maxckpt": ours})
    shutil.rmtree(work / "maxtext-by-maxckpt")
    # MaxText -> HF, both from MaxText's own output
    items = next(theirs_mt.rglob("0/items"))
    console.print(f"MaxText -> HF (from {items.relative_to(work)}): MaxText's to_huggingface ...")
    theirs = best_of(n, [python, "-m", "maxtext.checkpoint_conversion.to_huggingface", base_yml, *keys,
                         f"load_parameters_path={items}", f"base_output_directory={work / 'hf-by-maxtext'}",
                         "weight_dtype=bfloat16", f"--hf_model_path={hf}", "--override_model_architecture"],
                     mt_env, work / "to_huggingface.log", work / "hf-by-maxtext")
    console.print(f"  {theirs['seconds']:.1f} s, {theirs['peak_rss'] / 1e6:.0f} MB; maxckpt ...")
    ours = best_of(n, [*maxckpt, str(items.parent.parent), str(work / "hf-by-maxckpt"), "--to", "hf", "--model",
                       "llama3.1", "-q"], ours_env, work / "maxckpt-to-hf.log", work / "hf-by-maxckpt")
    rows.append({"direction": "maxtext -> hf", "maxtext": theirs, "maxckpt": ours})
    largest = largest_tensor(spec)
    return [{**r, "model": "llama3.1", "params": params, "dims": DIMS[args.dims], "largest_tensor": largest,
             "rss_goal": 2 * largest + 300e6, "speedup": r["maxtext"]["seconds"] / r["maxckpt"]["seconds"],
             "rss_ratio": r["maxtext"]["peak_rss"] / r["maxckpt"]["peak_rss"], "speedup_goal": SPEEDUP_GOAL,
             "cpus": os.cpu_count(), "load_average": os.getloadavg()} for r in rows]


def show(rows: list[dict], console) -> None:
    from rich.table import Table

    r0 = rows[0]
    table = Table(title=f"maxckpt vs MaxText 0.2.5's converters, llama3.1 {r0['params'] / 1e6:.1f}M params bf16, "
                  f"{r0['cpus']} cores (load {r0['load_average'][0]:.1f}); goal: >= {SPEEDUP_GOAL:g}x faster at peak RSS "
                  f"<= 2 x largest tensor ({r0['largest_tensor'] / 1e6:.0f} MB) + 300 MB = {r0['rss_goal'] / 1e6:.0f} MB",
                  title_justify="left")
    for col in ("direction", "MaxText s", "MaxText CPU s", "MaxText peak RSS", "maxckpt s", "maxckpt CPU s",
                "maxckpt peak RSS", "speedup", "RSS ratio", "goals met"):
        table.add_column(col, justify="right")
    for r in rows:
        met = ("time" if r["speedup"] >= r["speedup_goal"] else "") + (" rss" if r["maxckpt"]["peak_rss"] <= r["rss_goal"] else "")
        table.add_row(r["direction"], f"{r['maxtext']['seconds']:.1f}", f"{r['maxtext']['cpu']:.1f}",
                      f"{r['maxtext']['peak_rss'] / 1e6:.0f} MB", f"{r['maxckpt']['seconds']:.2f}", f"{r['maxckpt']['cpu']:.1f}",
                      f"{r['maxckpt']['peak_rss'] / 1e6:.0f} MB", f"{r['speedup']:.1f}x", f"{r['rss_ratio']:.1f}x",
                      met.strip() or "-")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", choices=sorted(DIMS), default="191m", help="model size (tiny: for a quick check)")
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER, help="a folder with tokenizer.json + tokenizer_config.json")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir, removed after)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each tool each way; the fastest counts (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, outputs)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    console = Console(width=max(160, Console().width))
    work = Path(tempfile.mkdtemp(prefix="maxckpt-vs-maxtext-", dir=args.work))
    try:
        rows = run(args, work, console)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    show(rows, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
