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
