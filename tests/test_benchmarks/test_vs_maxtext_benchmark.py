"""benchmarks/vs_maxtext.py measures each tool as its own process: that process's peak RSS and CPU, not the parent's
(the MaxText runs themselves are minutes long, so the suite checks the measurement, not the comparison)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import vs_maxtext  # noqa: E402

HOLD = "import numpy as np, time; a = np.ones(300 * 2**20 // 8); t = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


def test_a_command_is_measured_by_its_own_peak_rss_and_cpu(tmp_path):
    run = vs_maxtext.measured([sys.executable, "-c", HOLD], dict(os.environ), tmp_path / "log")
    assert 300 * 2**20 <= run["peak_rss"] < 300 * 2**20 + 200e6  # its 300 MiB array, not this test process
    assert run["cpu"] >= 0.3 and run["seconds"] >= run["cpu"] / os.cpu_count()


def test_a_failing_command_raises_with_its_log(tmp_path):
    with pytest.raises(RuntimeError, match=r"exited 3 \(log .*\):\nbroken"):
        vs_maxtext.measured([sys.executable, "-c", "import sys; print('broken'); sys.exit(3)"], dict(os.environ),
                            tmp_path / "log")


def test_maxtext_is_given_the_models_sizes_both_in_its_config_and_its_hf_table():
    spec = vs_maxtext.spec_for("191m")
    keys = dict(k.split("=", 1) for k in vs_maxtext.maxtext_keys(spec))
    sizes = vs_maxtext.hf_sizes(spec)
    assert (keys["base_emb_dim"], keys["base_num_decoder_layers"], keys["vocab_size"]) == ("576", "9", "128256")
    assert (sizes["hidden_size"], sizes["num_hidden_layers"], sizes["vocab_size"]) == (576, 9, 128256)
    params = sum(vs_maxtext.math.prod(s) for s, _ in vs_maxtext.beyond_ram.tensors_of(spec).values())
    assert round(params / 1e6, 1) == 191.6 and vs_maxtext.largest_tensor(spec) == 128256 * 576 * 2
