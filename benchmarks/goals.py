"""Issue 27's goals (issue 13's, against floors that count the CPU), all measured in one command.

Why one command: the goals are stated against physical floors measured on
the same machine, and the development VM (2 shared cores) cannot settle
several of them. Whoever has a larger or quieter machine runs this once and
gets every goal with its number, met or not, and the JSON of every
benchmark behind it. Every floor is max(read wall, write wall, (read CPU +
write CPU) / cores), each part measured in the same run on the same bytes;
issue 13's floor (max(read, write), the raw wall time for saves and
restores) is kept beside it ("old floor"):

- ``convert.py`` (io-limit suite) for ``--sizes``, every target both ways:
  time within 1.3x of the floor, and peak RSS within 2 x the largest piece
  + 300 MB (two goals per conversion);
- ``convert.py --processes`` (1, 2, 4 processes on this host, hf target):
  reported beside one process and a plain copy (the issue sets no number);
- ``save.py`` for each ``--save-cases`` (size:dtype): synchronous save >= 0.9x
  the raw write+fsync's floor, cold restore >= 0.9x the raw parallel read's
  (into fresh arrays), async blocking <= 2% of a synchronous save (medians
  of ``--save-repeats`` rounds);
- ``--vs-maxtext``: ``vs_maxtext.py``, MaxText 0.2.5's to_maxtext and
  to_huggingface against maxckpt on one 191.5M-parameter llama3.1
  checkpoint: >= 7x faster both ways at peak RSS <= 2 x largest tensor + 300 MB;
- ``--beyond-ram``: ``beyond_ram.py``, dense, mixtral and deepseek
  checkpoints larger than this machine's RAM both ways: peak RSS <= 3 GB and
  a bit-exact round trip (long: ~1 h on 2 cores; needs ~2x RAM of disk).

    python benchmarks/goals.py                                   # 0.5,2,8 GB; 1GiB:bfloat16,2GiB:float32
    python benchmarks/goals.py --sizes 0.5,2 --vs-maxtext --out results/
    python benchmarks/goals.py --from results/                   # the table again, from saved JSON

Each benchmark runs as its own process, exactly as documented in its
docstring; their JSON goes to ``--out`` (convert.json, processes.json,
save-<size>-<dtype>.json, vs_maxtext.json, beyond_ram.json) with
``goals.json``, the table below as data, and ``goals.md``, the same as a
markdown table. ``--strict`` exits 1 when a goal is not met (for a CI job on
a real machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _run(script: str, *args: str) -> None:
    """One benchmark in its own process; its tables go to this terminal as they are printed."""
    cmd = [sys.executable, str(HERE / script), *args]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _save_cases(text: str) -> list[tuple[str, str]]:
    cases = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        size, _, dtype = item.partition(":")
        cases.append((size, dtype or "bfloat16"))
    return cases


def _save_json(out: Path, size: str, dtype: str) -> Path:
    return out / f"save-{size}-{dtype}.json"


def measure(args: argparse.Namespace) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.sizes:
        _run("convert.py", "--sizes", args.sizes, "--targets", args.targets, "--repeats", str(args.repeats),
             "--cache", args.cache, "--json", str(out / "convert.json"))
    if args.processes:
        _run("convert.py", "--processes", args.processes, "--sizes", args.process_size, "--targets", "hf",
             "--repeats", str(args.repeats), "--json", str(out / "processes.json"))
    for size, dtype in _save_cases(args.save_cases):
        _run("save.py", "--size", size, "--dtype", dtype, "--repeats", str(args.save_repeats),
             "--json", str(_save_json(out, size, dtype)))
    if args.vs_maxtext:
        _run("vs_maxtext.py", "--json", str(out / "vs_maxtext.json"))
    if args.beyond_ram:
        _run("beyond_ram.py", "--json", str(out / "beyond_ram.json"))


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def collect(out: Path) -> dict[str, Any]:
    """Every goal found in the JSON under `out`, in the order the issue lists them."""
    goals: list[dict[str, Any]] = []
    for row in _read(out / "convert.json") or []:
        case = f"{row['model_bytes'] / 1e9:.2f} GB {row['conversion']} ({row.get('cache', 'warm')})"
        old = row.get("floor_old", max(row["read_floor"], row["write_floor"]))
        cores = row.get("cores", os.cpu_count())
        goals.append({"goal": "convert time / floor", "case": case, "measured": row["ratio"],
                      "target": f"<= {row['ratio_goal']}", "met": row["ratio"] <= row["ratio_goal"],
                      "measured_old_floor": row["seconds"] / old,
                      "detail": f"{row['seconds']:.2f} s against max(read {row['read_floor']:.2f} s, write {row['write_floor']:.2f} s, "
                                f"CPU {row['floor_cpu']:.1f} s / {cores}); old floor max(read, write): {row['seconds'] / old:.2f}x; "
                                f"maxckpt CPU {row['cpu']:.1f} s"})
        goals.append({"goal": "convert peak RSS", "case": case, "measured": row["peak_rss"] / 1e6,
                      "target": f"<= {row['rss_goal'] / 1e6:.0f} MB", "met": row["peak_rss"] <= row["rss_goal"],
                      "detail": f"largest piece {row['largest_piece'] / 1e6:.0f} MB"})
    scale_out = []
    for row in _read(out / "processes.json") or []:
        counts = sorted(int(k) for k in row if k.isdigit())
        one = row[str(counts[0])]["seconds"] if counts else None
        scale_out.append({
            "case": f"{row['model_bytes'] / 1e9:.2f} GB maxtext -> {row['to']}",
            "copy_seconds": row["copy"]["seconds"],
            "seconds": {n: row[str(n)]["seconds"] for n in counts},
            "speedup_over_first": {n: one / row[str(n)]["seconds"] for n in counts} if one else {},
        })
    for path in sorted(out.glob("save-*.json")):
        report = _read(path)
        size = report["size_bytes"]
        shown = f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / 2**20:g} MiB"
        case = f"{shown} {report['dtype']}, median of {report['repeats']}"
        for goal in report["goals"]:
            percent = goal["goal"].startswith("async")
            old = goal.get("measured_old_floor")
            goals.append({"goal": goal["goal"], "case": case, "measured": goal["measured"],
                          "target": (f"<= {goal['target']:.0%}" if percent else f">= {goal['target']:.2f}x"),
                          "met": goal["met"], "measured_old_floor": old,
                          "detail": "per round " + ", ".join(f"{v:.1%}" if percent else f"{v:.2f}x" for v in goal["per_round"])
                          + ("" if percent or old is None else f"; old floor (raw wall alone): {old:.2f}x")})
    for row in _read(out / "vs_maxtext.json") or []:
        case = f"{row['model']} {row['params'] / 1e6:.0f}M params, {row['direction']}"
        goals.append({"goal": "speed against MaxText", "case": case, "measured": row["speedup"],
                      "target": f">= {row['speedup_goal']:g}x", "met": row["speedup"] >= row["speedup_goal"],
                      "detail": f"maxckpt {row['maxckpt']['seconds']:.1f} s, MaxText {row['maxtext']['seconds']:.1f} s"})
        goals.append({"goal": "RSS against MaxText", "case": case, "measured": row["maxckpt"]["peak_rss"] / 1e6,
                      "target": f"<= {row['rss_goal'] / 1e6:.0f} MB", "met": row["maxckpt"]["peak_rss"] <= row["rss_goal"],
                      "detail": f"MaxText {row['maxtext']['peak_rss'] / 1e6:.0f} MB; largest tensor {row['largest_tensor'] / 1e6:.0f} MB"})
    for row in _read(out / "beyond_ram.json") or []:
        case = f"{row['layout']} {row['model_bytes'] / 1e9:.1f} GB ({row['ram_bytes'] / 1e9:.1f} GB RAM), {row['direction']}"
        goals.append({"goal": "beyond RAM peak RSS", "case": case, "measured": row["peak_rss"] / 1e6,
                      "target": f"<= {row['rss_goal'] / 1e6:.0f} MB", "met": row["peak_rss"] <= row["rss_goal"],
                      "detail": f"{row['mb_per_s']:.0f} MB/s ({row['seconds']:.0f} s)"})
        if "bit_exact" in row:
            goals.append({"goal": "beyond RAM bit-exact", "case": case, "measured": float(row["bit_exact"]),
                          "target": "every tensor", "met": bool(row["bit_exact"]),
                          "detail": f"{row['tensors_checked']} tensors compared with the source's"})
    return {"goals": goals, "met": sum(g["met"] for g in goals), "total": len(goals), "scale_out": scale_out,
            "cpus": os.cpu_count()}


def _shown(goal: dict[str, Any], value: Any) -> str:
    if value is None:
        return ""
    if "RSS" in goal["goal"]:
        return f"{value:.0f} MB"
    if goal["goal"].startswith("async"):
        return f"{value:.1%}"
    if "bit-exact" in goal["goal"]:
        return "yes" if value else "no"
    return f"{value:.2f}x"


def markdown(summary: dict[str, Any]) -> str:
    """The table as markdown (goals.md), for docs and reports."""
    lines = [f"issue 27 goals: {summary['met']} of {summary['total']} met ({summary['cpus']} CPUs)", "",
             "| goal | case | measured | old floor | target | met | detail |", "|---|---|---|---|---|---|---|"]
    for g in summary["goals"]:
        old = g.get("measured_old_floor")
        old = None if old is None or g["goal"].startswith("async") else old
        lines.append(f"| {g['goal']} | {g['case']} | {_shown(g, g['measured'])} | {_shown(g, old)} | {g['target']} | "
                     f"{'yes' if g['met'] else 'no'} | {g['detail']} |")
    for row in summary["scale_out"]:
        speedup = row["speedup_over_first"]
        cells = ", ".join(f"{n} proc {sec:.2f} s ({speedup[n]:.2f}x)" for n, sec in row["seconds"].items())
        lines += ["", f"scale-out {row['case']}: copy {row['copy_seconds']:.2f} s; {cells} (speed against the first)"]
    return "\n".join(lines) + "\n"


def show(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(160, Console().width))
    table = Table(title=f"issue 27 goals: {summary['met']} of {summary['total']} met ({summary['cpus']} CPUs)", title_justify="left")
    for col in ("goal", "case", "measured", "old floor", "target", "met", "detail"):
        table.add_column(col, justify="right" if col in ("measured", "old floor") else "left")
    for g in summary["goals"]:
        old = g.get("measured_old_floor")
        old = None if old is None or g["goal"].startswith("async") else old
        table.add_row(g["goal"], g["case"], _shown(g, g["measured"]), _shown(g, old), g["target"],
                      "yes" if g["met"] else "[red]no[/]", g["detail"])
    console.print(table)
    for row in summary["scale_out"]:
        speedup = row["speedup_over_first"]
        cells = ", ".join(f"{n} proc {sec:.2f} s ({speedup[n]:.2f}x)" for n, sec in row["seconds"].items())
        console.print(f"scale-out {row['case']}: copy {row['copy_seconds']:.2f} s; {cells} (speed against the first)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("issue13-results"), help="where the JSON goes (default ./issue13-results)")
    parser.add_argument("--from", dest="from_dir", type=Path, default=None, help="measure nothing: summarize the JSON in this folder")
    parser.add_argument("--sizes", default="0.5,2,8", help="conversion checkpoint sizes in GB (\"\": no conversion table)")
    parser.add_argument("--targets", default="hf,maxtext,megatron,torchtitan,torch", help="conversion targets")
    parser.add_argument("--cache", choices=("warm", "cold"), default="warm", help="conversions from a warm or an evicted page cache")
    parser.add_argument("--repeats", type=int, default=2, help="conversion runs per method; the fastest counts")
    parser.add_argument("--processes", default="1,2,4", help="process counts of the scale-out table (\"\": none)")
    parser.add_argument("--process-size", default="0.5", help="checkpoint size in GB for the scale-out table")
    parser.add_argument("--save-cases", default="1GiB:bfloat16,2GiB:float32", help="save.py states, SIZE:DTYPE comma-separated (\"\": none)")
    parser.add_argument("--save-repeats", type=int, default=4, help="save.py rounds; medians are reported")
    parser.add_argument("--vs-maxtext", action="store_true", help="also run vs_maxtext.py (MaxText's own converters)")
    parser.add_argument("--beyond-ram", action="store_true", help="also run beyond_ram.py (checkpoints larger than RAM; long)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any goal is not met")
    args = parser.parse_args(argv)
    folder = args.from_dir or args.out
    if args.from_dir is None:
        measure(args)
    summary = collect(folder)
    (folder / "goals.json").write_text(json.dumps(summary, indent=2))
    (folder / "goals.md").write_text(markdown(summary))
    show(summary)
    return 1 if args.strict and summary["met"] < summary["total"] else 0


if __name__ == "__main__":
    sys.exit(main())
