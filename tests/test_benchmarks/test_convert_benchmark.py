"""The conversion benchmark keeps working: its I/O-floor table and its scale-out table run on a tiny model
and write their JSON (no timing is asserted: numbers on a shared machine are noise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, object]:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "convert.py"), *args, "--work", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_io_limit_table_converts_each_way_and_measures_both_floors(tmp_path: Path) -> None:
    proc, rows = _run(tmp_path, "--sizes", "0.02", "--targets", "hf,maxtext", "--cache", "cold")
    assert [r["conversion"] for r in rows] == ["maxtext -> hf", "hf -> maxtext", "maxtext -> maxtext"]
    for r in rows:
        assert r["seconds"] > 0 and r["read_floor"] > 0 and r["write_floor"] > 0
        # issue 27's floor counts the CPU: max(read wall, write wall, (read CPU + write CPU) / cores), same run
        assert r["floor_cpu"] == r["read_cpu"] + r["write_cpu"] and r["cores"] == os.cpu_count()
        assert r["floor"] == max(r["read_floor"], r["write_floor"], r["floor_cpu"] / r["cores"])
        assert r["floor_old"] == max(r["read_floor"], r["write_floor"]) and r["ratio_old"] == r["seconds"] / r["floor_old"]
        assert r["ratio"] == r["seconds"] / r["floor"] and r["read_cpu"] > 0 and r["write_cpu"] > 0
        assert r["output_bytes"] >= 0.9 * r["model_bytes"] and r["peak_rss"] > r["idle_rss"] > 0
    assert {r["cache"] for r in rows} == {"cold"}
    assert all(r["fresh_pages_first_s_per_gib"] > 0 and r["fresh_pages_again_s_per_gib"] > 0 for r in rows)
    assert "Machine: faulting in fresh 4 KiB pages" in proc.stdout
    assert "goal: ratio <= 1.3" in proc.stdout and "cold page cache" in proc.stdout and "(read CPU + write CPU)" in proc.stdout


def test_scale_out_table_runs_one_and_two_processes(tmp_path: Path) -> None:
    proc, rows = _run(tmp_path, "--processes", "1,2", "--sizes", "0.02")
    (row,) = rows
    assert row["to"] == "hf" and row["copy"]["seconds"] > 0
    assert row["1"]["seconds"] > 0 and row["2"]["seconds"] > 0
    assert "2 proc: convert s" in proc.stdout
