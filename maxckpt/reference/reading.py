"""Read a MaxText checkpoint's parameters for the reference forward, routing biases included.

A Llama-family model has nothing but `params`. DeepSeek's routing bias (HF `e_score_correction_bias`)
is not a parameter in MaxText: it is an NNX `MoEBiasVar` that training
updates outside the optimizer, saved under `nnx_aux/model/...` next to the RNG
state, with its layer axis first. Dropping it changes the fixture's logits by
up to 0.24, so the reference reads every floating `nnx_aux` leaf that is not
RNG state and keeps it under its stored name (`nnx_aux/model/decoder/...`).

>>> params = read_maxtext_params(OrbaxReader("run/checkpoints/5/items"))   # doctest: +SKIP
>>> params["nnx_aux/model/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias"].shape  # doctest: +SKIP
(2, 4)
"""

from __future__ import annotations

from typing import Mapping, Protocol

import numpy as np

from maxckpt.formats.maxtext.layout import canonical_names
from maxckpt.tensors import TensorInfo


class ParamSource(Protocol):
    """What the reference reads parameters through: an OrbaxReader, an opened maxckpt Checkpoint, ..."""

    def tensors(self) -> Mapping[str, TensorInfo]:
        """Every stored tensor by name, without reading any."""
        ...

    def read(self, name: str) -> np.ndarray:
        """One tensor's values."""
        ...


def _is_aux_state(name: str, info: TensorInfo) -> bool:
    return (
        name.startswith("nnx_aux/")
        and "/rngs/" not in name
        and np.issubdtype(np.dtype(info.dtype), np.floating)
    )


def read_maxtext_params(source: ParamSource) -> dict[str, np.ndarray]:
    """Params (no `params/params/` prefix) plus non-RNG `nnx_aux` leaves, as float32 arrays.

    `source` is anything with `tensors()` and `read(name)` over a MaxText checkpoint's stored names (an
    OrbaxReader, an opened maxckpt Checkpoint): the reference reads no files itself.
    """
    infos = source.tensors()
    out = {canon: np.asarray(source.read(stored), np.float32) for canon, stored in canonical_names(infos).items()}
    out.update({n: np.asarray(source.read(n), np.float32) for n, i in infos.items() if _is_aux_state(n, i)})
    return out


__all__ = ["ParamSource", "read_maxtext_params"]
