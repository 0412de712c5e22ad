"""Integrity manifests: every checkpoint maxckpt writes proves its bytes; `verify --integrity` finds a flipped byte.

Tiny models only: one MaxText run (written by plain Orbax, so it has no
manifest) is exported once per module to every format; each test copies
what it damages.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import maxckpt
from maxckpt.conversion.options import SourceOptions
from maxckpt.formats import MaxTextOptions
from maxckpt import integrity
from maxckpt.conversion.checkpoint import open_checkpoint
from maxckpt.conversion.integrity_check import check_integrity
from maxckpt.errors import CorruptCheckpointError

from cli_runner import run_cli
from conversion_models import random_maxtext_params, save_maxtext_run, tiny_spec

MODEL = "llama3"
EXPORTS = {  # name -> (target, convert kwargs)
    "hf": ("hf", {}),
    "mcore": ("megatron", {}),
    "titan": ("torchtitan", {}),
    "model.pt": ("torch", {}),
    "mt-raw": ("maxtext", {}),
    "mt-zstd": ("maxtext", {"options": MaxTextOptions(compression="zstd")}),
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("integrity")
    run = save_maxtext_run(root / "run", random_maxtext_params(tiny_spec(MODEL)))
    out = {"run": run}
    for name, (to, kwargs) in EXPORTS.items():
        maxckpt.convert(run, root / name, to=to, model=MODEL, **kwargs)
        out[name] = root / name
    return out


def _copy(src: Path, dst: Path) -> Path:
    if src.is_file():
        shutil.copy(src, dst)
        sidecar = Path(f"{src}{integrity.SIDECAR_SUFFIX}")
        if sidecar.exists():
            shutil.copy(sidecar, f"{dst}{integrity.SIDECAR_SUFFIX}")
    else:
        shutil.copytree(src, dst)
    return dst


def _files(root: Path) -> list[Path]:
    return [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and "manifest" not in p.name)


def _pick(path: Path, zstd: bool = False) -> tuple[list[str], np.ndarray]:
    """The largest tensor of `path` (its name alone), or for `zstd` every tensor of its byte size (a frame of that size is one of theirs)."""
    with open_checkpoint(path) as ckpt:
        infos = ckpt.tensors()
        name = max(infos, key=lambda n: (infos[n].nbytes, n))
        same = [n for n, i in infos.items() if i.nbytes == infos[name].nbytes] if zstd else [name]
        return same, np.ascontiguousarray(ckpt.read(name))


def _flip_raw(root: Path, values: np.ndarray) -> None:
    needle = values.tobytes()[:32]
    for f in _files(root):
        data = bytearray(f.read_bytes())
        at = data.find(needle)
        if at >= 0:
            data[at + 17] ^= 0x40  # inside the tensor's bytes
            f.write_bytes(bytes(data))
            return
    raise AssertionError(f"bytes of the tensor not found under {root}")


def _zstd_frames(data: bytes):
    """(offset, header end, content size) of each zstd frame that states its content size."""
    at = data.find(b"\x28\xb5\x2f\xfd")
    while at >= 0:
        fhd = data[at + 4]
        fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
        pos = at + 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        width = (1 if single else 0, 2, 4, 8)[fcs_flag]
        if width:
            size = int.from_bytes(data[pos : pos + width], "little") + (256 if width == 2 else 0)
            yield at, pos + width, size
        at = data.find(b"\x28\xb5\x2f\xfd", at + 4)


def _flip_zstd(root: Path, nbytes: int, at_header: bool = False) -> None:
    """Flip a byte inside every zstd frame of `nbytes` content (its first block's data, or its magic number)."""
    flipped = 0
    for f in _files(root):
        data = bytearray(f.read_bytes())
        for start, header_end, size in list(_zstd_frames(bytes(data))):
            if size == nbytes:
                data[start if at_header else header_end + 3 + 5] ^= 0x40
                flipped += 1
        f.write_bytes(bytes(data))
    assert flipped, f"no zstd frame of {nbytes} bytes under {root}"


def _named(err: str, tensors: list[str]) -> bool:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    return len(lines) == 1 and any(f"tensor {t}:" in lines[0] for t in tensors)


# ---------------------------------------------------------------------- the manifest


def test_pieces_in_c_order_hash_as_the_whole_tensor_others_keep_their_boxes() -> None:
    x = np.random.default_rng(0).standard_normal((4, 3, 5)).astype(np.float32)
    m = integrity.Manifest()
    m.add("whole", x)
    for k in range(4):
        m.add_piece("rows", x.shape, x.dtype, (k,), x[k])
    m.end("rows", x.shape, x.dtype)
    for k in range(3):
        m.add_piece("cols", x.shape, x.dtype, (slice(None), k), x[:, k])
    m.end("cols", x.shape, x.dtype)
    doc = json.loads(m.to_json())
    assert doc["algorithm"] == "crc32c" and doc["version"] == 1
    t = doc["tensors"]
    assert t["rows"]["crc32c"] == t["whole"]["crc32c"] and t["whole"]["dtype"] == "float32" and t["whole"]["shape"] == [4, 3, 5]
    assert [p["index"] for p in t["cols"]["pieces"]] == [[[0, 4], [k, k + 1], [0, 5]] for k in range(3)]


def test_every_export_and_a_manager_save_carry_a_manifest_that_verifies(exports, tmp_path: Path, capsys) -> None:
    places = {
        "hf": exports["hf"] / integrity.MANIFEST_NAME,
        "mcore": exports["mcore"] / "iter_0000001" / integrity.MANIFEST_NAME,
        "titan": exports["titan"] / "step-1" / integrity.MANIFEST_NAME,
        "model.pt": Path(f"{exports['model.pt']}{integrity.SIDECAR_SUFFIX}"),
        "mt-raw": exports["mt-raw"] / "0" / integrity.MANIFEST_NAME,
        "mt-zstd": exports["mt-zstd"] / "0" / integrity.MANIFEST_NAME,
    }
    for name, place in places.items():
        assert place.is_file(), name
        code, out, err = run_cli(["verify", exports[name], "--integrity"], capsys)
        assert code == 0, (name, out, err)
        assert "verify ok" in out and "no manifest" not in out + err
    from manager_states import make_state

    with maxckpt.CheckpointManager(tmp_path / "checkpoints", async_save=True) as mgr:
        mgr.save(0, make_state(0))
    assert (tmp_path / "checkpoints" / "0" / integrity.MANIFEST_NAME).is_file()
    code, out, _ = run_cli(["verify", tmp_path / "checkpoints", "--integrity"], capsys)
    assert code == 0 and "verify ok" in out


@pytest.mark.parametrize("name", list(EXPORTS))
def test_a_flipped_byte_is_found_and_a_conversion_from_it_fails_naming_the_tensor(exports, tmp_path: Path, name: str, capsys) -> None:
    damaged = _copy(exports[name], tmp_path / name)
    tensors, values = _pick(damaged, zstd=name == "mt-zstd")
    if name == "mt-zstd":
        _flip_zstd(damaged, values.nbytes)
    else:
        _flip_raw(damaged, values)
    code, out, err = run_cli(["verify", damaged, "--integrity"], capsys)
    assert code != 0 and _named(err, tensors), err
    with pytest.raises(CorruptCheckpointError) as info:
        maxckpt.convert(damaged, tmp_path / "dst", to="hf" if name.startswith("mt") else "maxtext", model=MODEL,
                        source=SourceOptions(overrides={"head_dim": 16} if name == "model.pt" else None))  # one torch file has no config.json
    assert any(f"tensor {t}:" in str(info.value) for t in tensors), info.value
    assert not (tmp_path / "dst").exists() and not list(tmp_path.glob("dst.tmp-*"))


def test_a_flipped_byte_in_a_manager_save_is_found(tmp_path: Path, capsys) -> None:
    from manager_states import make_state

    with maxckpt.CheckpointManager(tmp_path / "checkpoints", async_save=False) as mgr:
        mgr.save(0, make_state(0))
    step = tmp_path / "checkpoints" / "0"
    kernel = "params/params/decoder/layers/mlp/wi/kernel"
    with open_checkpoint(step) as ckpt:
        values = np.ascontiguousarray(ckpt.read(kernel))
    _flip_raw(step / "items", values)
    code, _, err = run_cli(["verify", step, "--integrity"], capsys)
    assert code != 0 and f"tensor {kernel}:" in err


def test_a_checkpoint_without_a_manifest_gets_its_formats_checks(exports, maxtext_fixtures: Path, capsys) -> None:
    for path in (exports["run"], maxtext_fixtures / "gemma2_scan" / "checkpoints"):
        code, out, err = run_cli(["verify", path, "--integrity"], capsys)
        assert code == 0, err
        assert "no manifest" in err and "every chunk decodes" in out


def test_an_undecodable_chunk_without_a_manifest_fails_naming_the_tensor(exports, tmp_path: Path, capsys) -> None:
    damaged = _copy(exports["mt-zstd"], tmp_path / "mt")
    (damaged / "0" / integrity.MANIFEST_NAME).unlink()
    tensors, values = _pick(damaged, zstd=True)
    _flip_zstd(damaged, values.nbytes, at_header=True)
    code, _, err = run_cli(["verify", damaged, "--integrity"], capsys)
    assert code != 0 and _named(err, tensors) and "no manifest" in err, err


def test_verify_integrity_takes_one_checkpoint(exports, capsys) -> None:
    code, _, err = run_cli(["verify", exports["hf"], exports["hf"], "--integrity"], capsys)
    assert code != 0 and "one checkpoint" in err
    code, out, _ = run_cli(["verify", "--help"], capsys)
    assert "--integrity" in out


def test_a_damaged_manifest_is_one_error_saying_what_to_do(exports, tmp_path: Path, capsys) -> None:
    damaged = _copy(exports["hf"], tmp_path / "hf")
    (damaged / integrity.MANIFEST_NAME).write_text('{"format": "maxckpt-manifest", "tensors": [')
    code, _, err = run_cli(["verify", damaged, "--integrity"], capsys)
    assert code != 0 and "unreadable integrity manifest" in err and "remove it" in err


@pytest.mark.parametrize("to", ["hf", "maxtext"])  # spooled and uploaded / written in place by TensorStore
def test_an_export_to_a_bucket_carries_its_manifest_committed_with_it(exports, bucket_url: str, to: str, capsys) -> None:
    from maxckpt.storage import objects

    dst = f"{bucket_url}/{to}"
    maxckpt.convert(exports["run"], dst, to=to, model=MODEL)
    where = f"{dst}/{integrity.MANIFEST_NAME}" if to == "hf" else f"{dst}/0/{integrity.MANIFEST_NAME}"
    assert objects.exists(where)
    code, out, err = run_cli(["verify", dst, "--integrity"], capsys)
    assert code == 0 and "verify ok" in out and "no manifest" not in err, err


def test_a_truncated_dcp_data_file_without_a_manifest_names_a_tensor_it_cut(exports, tmp_path: Path, capsys) -> None:
    damaged = _copy(exports["titan"], tmp_path / "titan")
    (damaged / "step-1" / integrity.MANIFEST_NAME).unlink()
    data = sorted((damaged / "step-1").glob("*.distcp"))[0]
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    code, out, err = run_cli(["verify", damaged, "--integrity"], capsys)
    assert code != 0 and "no manifest" in err and "truncated file?" in err and "inside its data file" in out, err


def test_a_source_read_in_other_pieces_than_hashed_is_checked_by_one_more_read() -> None:
    from maxckpt.tensors import TensorInfo

    x = np.random.default_rng(1).standard_normal((4, 3, 5)).astype(np.float32)

    class Reader:
        def __init__(self, array):
            self.array = array

        def tensors(self):
            return {"w": TensorInfo("w", x.shape, x.dtype)}

        def read(self, name, index=None):
            return self.array[index if index is not None else ()].copy()

        def close(self):
            pass

    m = integrity.Manifest()
    m.add("w", x)
    good = integrity.CheckingReader(Reader(x), m.entries, "src")
    for k in range(3):  # columns: not the whole tensor, not in C order
        good.read("w", (slice(None), k))
    assert good.finish() == 1
    bad = x.copy()
    bad[2, 1, 3] += 1
    checker = integrity.CheckingReader(Reader(bad), m.entries, "src")
    checker.read("w", (slice(None), 0))
    with pytest.raises(CorruptCheckpointError, match="tensor w: content hash"):
        checker.finish()
    with pytest.raises(CorruptCheckpointError, match="tensor w: content hash"):  # read whole: checked at once
        integrity.CheckingReader(Reader(bad), m.entries, "src").read("w")


@pytest.mark.parametrize("name,to", [("mt-raw", "maxtext"), ("hf", "hf")])
def test_a_tensor_copied_unchanged_from_a_checked_source_is_hashed_once(exports, tmp_path: Path, monkeypatch, name: str, to: str) -> None:
    def hashed_bytes(dst: Path) -> int:
        total = [0]
        crc32c = integrity.crc32c

        def counting(array, crc=0):
            total[0] += np.asarray(array).nbytes
            return crc32c(array, crc)

        with monkeypatch.context() as m:
            m.setattr(integrity, "crc32c", counting)
            maxckpt.convert(exports[name], dst, to=to, model=MODEL)
        return total[0]

    once = hashed_bytes(tmp_path / "once")
    with open_checkpoint(tmp_path / "once") as ckpt:
        size = sum(int(np.prod(i.shape)) * np.dtype(i.dtype).itemsize for i in ckpt.tensors().values())
    assert once == size  # the source check's hash is the output's: each tensor hashed once
    assert check_integrity(tmp_path / "once").ok  # and the manifest is what hashing the output gives

    with monkeypatch.context() as m:  # without reuse every tensor is hashed twice (checked, then written)
        m.setattr(integrity.CheckingReader, "known_crc", lambda self, array: None)
        assert hashed_bytes(tmp_path / "twice") == 2 * size


def test_a_known_crc_is_taken_only_for_the_very_array_the_check_hashed() -> None:
    from maxckpt.tensors import TensorInfo

    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)

    class Reader:
        def tensors(self):
            return {"w": TensorInfo("w", x.shape, x.dtype)}

        def read(self, name, index=None):
            return x[index if index is not None else ()].copy()

    m = integrity.Manifest()
    m.add("w", x)
    checker = integrity.CheckingReader(Reader(), m.entries, "src")
    whole = checker.read("w")
    assert checker.known_crc(whole) == integrity.crc32c(x)
    with pytest.raises(ValueError):  # read-only: nothing changes it after it was hashed
        whole[0, 0] = 1
    assert checker.known_crc(whole.astype(np.float64)) is None  # cast: hashed anew
    assert checker.known_crc(whole * 2) is None  # transformed
    assert checker.known_crc(whole[1:]) is None  # sliced (another object)
    assert checker.known_crc(whole.reshape(6, 4)) is None  # another shape
    part = checker.read("w", (slice(0, 2),))  # already checked: not hashed again, nothing to reuse
    assert checker.known_crc(part) is None

    out = integrity.Manifest()
    out.known_crc = checker.known_crc
    out.add("w", whole)
    out.add("v", (whole + 1).astype(np.float32))
    assert out.entries["w"] == m.entries["w"]
    assert out.entries["v"]["crc32c"] == f"{integrity.crc32c(x + 1):08x}"


def test_a_scalar_read_from_a_checked_source_is_passed_on_as_it_is():
    """A 0-d tensor (a training checkpoint's `step`) reads as a numpy scalar, which has no flags to set:
    the check returns it untouched (it used to raise "Cannot set flags on array scalars" and fail exports)."""
    from maxckpt.integrity import CheckingReader

    class OneScalar:
        def tensors(self):
            return {}

        def read(self, name, index=None):
            return np.float32(3.0)

    checker = CheckingReader(OneScalar(), {}, "somewhere")
    value = np.float32(3.0)
    assert checker._remember(value, 0) is value
    zero_d = np.asarray(3.0, np.float32)
    assert checker._remember(zero_d, 0) is zero_d and zero_d.flags.writeable
