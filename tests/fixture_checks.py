"""What the MaxText family-fixture tests share: the arrays of a MaxText checkpoint and of an HF folder, a
bit-for-bit comparison, and transformers' own logits of a converted folder.

transformers must load the folder with no missing, unexpected or mismatched keys: a mapping that drops or
renames a tensor fails here, not only in the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from maxckpt.containers.safetensors import SafetensorsReader
from maxckpt.conversion import open_checkpoint
from maxckpt.formats.maxtext.layout import canonical_names


def maxtext_arrays(path: Path, **kw: Any) -> dict[str, np.ndarray]:
    """Every model array of a MaxText checkpoint (params and nnx_aux model variables), by canonical path."""
    with open_checkpoint(path, format="maxtext", **kw) as ckpt:
        lazies = ckpt.lazy_tensors()
        return {canon: lazies[stored].read() for canon, stored in canonical_names(lazies).items()}


def hf_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of an HF safetensors folder, by name."""
    reader = SafetensorsReader(path)
    return {n: reader.read(n) for n in reader.tensors()}


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """The same names, dtypes, shapes and bytes."""
    assert sorted(got) == sorted(want)
    for n in want:
        assert got[n].dtype == want[n].dtype and got[n].shape == want[n].shape, n
        assert np.array_equal(got[n].view(np.uint8), want[n].view(np.uint8)), n


def transformers_logits(path: Path, tokens: Any, bf16_output_table: bool = False,
                        architecture: str | None = None) -> np.ndarray:
    """transformers' float32 logits of the HF folder at `path` for `tokens` ([batch, length]).

    bf16_output_table: multiply by a bfloat16 copy of the input table, as MaxText's tied output does
    (`attend_on_embedding`); only the in-memory model changes, never the files. architecture: the class
    AutoModelForCausalLM must pick.
    """
    import torch
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    if architecture is not None:
        assert type(model).__name__ == architecture
    if bf16_output_table:
        table = model.get_input_embeddings().weight.detach().to(torch.bfloat16).float().clone()
        model.lm_head.weight = torch.nn.Parameter(table)
    with torch.no_grad():
        return model.eval()(torch.tensor(np.asarray(tokens, np.int64))).logits.numpy()


def items(name: str) -> Path:
    """The items folder of MaxText fixture run `name` (its step 5)."""
    from conftest import MAXTEXT_FIXTURES

    return MAXTEXT_FIXTURES / name / "checkpoints" / "5" / "items"


def assert_maxtext_round_trips(run: dict, scanned_prefixes: tuple[str, ...], unscanned_tensor: str, **kw: Any) -> None:
    """MaxText -> HF -> MaxText scanned gives the fixture's arrays back bit for bit; so does MaxText unscanned
    (no `scanned_prefixes` left, `unscanned_tensor` there) -> rescanned, and unscanned -> HF the HF export.

    `run`: the fixture's name, its float32 HF export (`hf`) and a scratch folder (`root`); `kw` go to convert.
    """
    from maxckpt.conversion import convert
    from maxckpt.formats import MaxTextOptions

    root, original = run["root"], maxtext_arrays(items(run["name"]))
    convert(run["hf"], root / "scanned", to="maxtext", options=MaxTextOptions(scan_layers=True), **kw)
    assert_same(maxtext_arrays(root / "scanned"), original)
    convert(items(run["name"]), root / "unscanned", to="maxtext", options=MaxTextOptions(scan_layers=False), **kw)
    unscanned = maxtext_arrays(root / "unscanned")
    assert not any(n.startswith(scanned_prefixes) for n in unscanned) and unscanned_tensor in unscanned
    convert(root / "unscanned", root / "rescanned", to="maxtext", options=MaxTextOptions(scan_layers=True), **kw)
    assert_same(maxtext_arrays(root / "rescanned"), original)
    convert(root / "unscanned", root / "hf2", to="hf", dtype="float32", **kw)
    assert_same(hf_arrays(root / "hf2"), hf_arrays(run["hf"]))


def assert_bf16_round_trip(run: dict, **kw: Any) -> Any:
    """MaxText -> HF bf16 -> MaxText (family and settings from config.json alone) -> HF bf16 is bit-exact, and
    verify agrees; returns the HF -> MaxText report. `kw` (model, source) go to the conversions from MaxText."""
    import ml_dtypes

    from maxckpt.conversion import convert
    from maxckpt.conversion.verify import verify

    root = run["root"]
    convert(items(run["name"]), root / "hf16", to="hf", dtype="bfloat16", **kw)
    first = hf_arrays(root / "hf16")
    assert {a.dtype for a in first.values()} == {np.dtype(ml_dtypes.bfloat16)}
    report = convert(root / "hf16", root / "mt16", to="maxtext")
    assert report.spec.family == run["family"]
    convert(root / "mt16", root / "hf16b", to="hf", dtype="bfloat16", **kw)
    assert_same(hf_arrays(root / "hf16b"), first)
    extra = {"source": kw["source"]} if "source" in kw else {}
    assert verify(root / "hf16", root / "mt16", model_b=kw.get("model"), **extra).ok
    return report
