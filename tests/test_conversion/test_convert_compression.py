"""`maxckpt convert --to maxtext --compression none|zstd`: the codec chain of the arrays written, and that
plain Orbax (what MaxText restores with) reads either back bit for bit.

No compression is the default, as for the manager's saves: zstd costs more
CPU than the disk time it saves. `zstd` is what MaxText itself writes, for
users who pay for bucket bytes.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from cli_runner import run_cli
from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec
from hostile_tools import one_error_line
from maxckpt.formats import MaxTextOptions
from maxckpt.conversion import convert
from maxckpt.conversion.scheduling import SLACK, inflight_budget
from maxckpt.errors import ConversionError
from orbax_checks import codecs, plain_orbax_restore

EMBED = "params.params.token_embedder.embedding"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    spec = tiny_spec("llama2", layers=2)
    return save_maxtext_run(tmp_path_factory.mktemp("src") / "run", random_maxtext_params(spec), step=1).parent


def _plain_orbax_restore(items: Path) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(plain_orbax_restore(items))[0]
    return {".".join(str(getattr(k, "key", k)) for k in path): np.asarray(v) for path, v in flat}


def _data_bytes(items: Path) -> int:
    return sum(p.stat().st_size for p in (items / "d").rglob("*") if p.is_file())


def test_no_compression_by_default_and_zstd_when_asked_both_restore_exactly(run_dir, tmp_path, capsys):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    convert(run_dir, tmp_path / "hf", to="hf", model="llama2")
    convert(tmp_path / "hf", plain, to="maxtext", model="llama2")
    code, _, err = run_cli(["convert", tmp_path / "hf", packed, "--to", "maxtext", "--model", "llama2", "-q",
                            "--compression", "zstd"], capsys)
    assert code == 0, err
    items = {"plain": plain / "0" / "items", "packed": packed / "0" / "items"}

    assert codecs(items["plain"], EMBED) == ["bytes"]
    assert codecs(items["packed"], EMBED) == ["bytes", "zstd"]
    restored = {k: _plain_orbax_restore(v) for k, v in items.items()}
    assert restored["plain"].keys() == restored["packed"].keys() and len(restored["plain"]) >= 5
    for name, array in restored["plain"].items():
        np.testing.assert_array_equal(array, restored["packed"][name])
    assert _data_bytes(items["packed"]) < _data_bytes(items["plain"])


def test_unknown_compression_is_one_error_and_writes_nothing(run_dir, tmp_path, capsys):
    dst = tmp_path / "out"
    code, _, err = run_cli(["convert", run_dir, dst, "--to", "maxtext", "--model", "llama2", "-q", "--compression", "gzip"], capsys)
    one_error_line(code, err, "compression must be one of none, zstd", "'gzip'")
    assert not dst.exists() and not list(tmp_path.glob("out.tmp-*"))
    with pytest.raises(ConversionError, match="compression must be one of"):
        convert(run_dir, dst, to="maxtext", model="llama2", options=MaxTextOptions(compression="lz4"))


def test_bytes_in_flight_follow_the_largest_piece_not_a_fixed_amount():
    mb = 1 << 20
    # Two of the largest pieces (one read while one is written) and a little room for small ones ...
    assert inflight_budget(None, 100 * mb) == 200 * mb + SLACK
    assert inflight_budget(None, 1 * mb) == 2 * mb + SLACK
    # ... at most 256 MB or the --read-budget, never less than the largest piece, which must fit.
    assert inflight_budget(None, 200 * mb) == 256 * mb
    assert inflight_budget(64 * mb, 1 * mb) == 2 * mb + SLACK
    assert inflight_budget(16 * mb, 1 * mb) == 16 * mb
    assert inflight_budget(16 * mb, 1024 * mb) == 1024 * mb
