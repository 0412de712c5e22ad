"""numpy <-> torch without losing bfloat16 or float8.

The conversion pipeline passes numpy arrays (with `ml_dtypes` for bfloat16 and
float8); torch containers store torch tensors. `torch.from_numpy` and
`Tensor.numpy()` refuse those extension dtypes, so both directions go through a
same-width integer view: no copy, no rounding, bit-exact.

>>> import ml_dtypes, numpy as np
>>> t = to_torch(np.ones(3, dtype=ml_dtypes.bfloat16))
>>> t.dtype, to_numpy(t).dtype
(torch.bfloat16, dtype(bfloat16))
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import torch

# Extension dtypes numpy only knows through ml_dtypes, with the integer type of
# the same width used to move their bits across.
_VIEWED: dict[torch.dtype, tuple[np.dtype, np.dtype]] = {
    torch.bfloat16: (np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16)),
    torch.float8_e4m3fn: (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.uint8)),
    torch.float8_e5m2: (np.dtype(ml_dtypes.float8_e5m2), np.dtype(np.uint8)),
}
_VIEW_INT_TORCH = {np.dtype(np.uint16): torch.uint16, np.dtype(np.uint8): torch.uint8}

_PLAIN: dict[torch.dtype, np.dtype] = {
    torch.float64: np.dtype(np.float64),
    torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16),
    torch.int64: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.int16: np.dtype(np.int16),
    torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
_NUMPY_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in _PLAIN.items()}
_NUMPY_TO_TORCH.update({np_dt: t for t, (np_dt, _) in _VIEWED.items()})


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy (or ml_dtypes) dtype that holds a torch dtype's values exactly."""
    if dtype in _VIEWED:
        return _VIEWED[dtype][0]
    try:
        return _PLAIN[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no numpy equivalent") from None


def torch_dtype(dtype: np.dtype | type) -> torch.dtype:
    """The torch dtype for a numpy (or ml_dtypes) dtype."""
    try:
        return _NUMPY_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"numpy dtype {np.dtype(dtype)} has no torch equivalent") from None


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array sharing its memory (bfloat16 kept as bfloat16)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype in _VIEWED:
        np_dt, int_dt = _VIEWED[tensor.dtype]
        return tensor.view(_VIEW_INT_TORCH[int_dt]).numpy().view(np_dt)
    numpy_dtype(tensor.dtype)  # raises a clear TypeError for unsupported dtypes
    return tensor.numpy()


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A numpy array as a CPU tensor sharing its memory where numpy allows it."""
    array = np.asarray(array)
    target = torch_dtype(array.dtype)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        # Read-only arrays (mmapped sources) are fine: writers only read the tensor.
        warnings.simplefilter("ignore", UserWarning)
        if target in _VIEWED:
            int_dt = _VIEWED[target][1]
            return torch.from_numpy(array.view(int_dt)).view(target)
        return torch.from_numpy(array)
