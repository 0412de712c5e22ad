"""The save benchmark keeps working: it runs on a tiny state and writes its JSON (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_save_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "save.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "save.py"), "--size", "4MiB", "--repeats", "1",
         "--dir", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["size_bytes"] == 4 * 1024**2 and report["dtype"] == "bfloat16"
    methods = [r["method"] for r in report["results"]]
    assert methods[0].startswith("raw write") and "plain Orbax" in methods[1] and len(methods) == 5
    assert all(r["seconds"] > 0 and r["gib_per_s"] > 0 for r in report["results"])
    assert list(tmp_path.iterdir()) == [out]  # nothing left behind
    assert "vs plain Orbax" in proc.stdout
