"""`torch.load(weights_only=True)` with torch's own allow-list, whatever else the process registered.

`weights_only=True` admits torch's built-in safe globals plus every global
registered with `torch.serialization.add_safe_globals` anywhere in the process.
Libraries do register some: importing megatron-core adds `io.BytesIO`,
`numpy._reconstruct`, `numpy.ndarray`, `pathlib.PosixPath` and more. What a
checkpoint file may make maxckpt construct must not depend on which libraries
the user's process happened to import, so every load of a file maxckpt reads
goes through :func:`load_weights_only`, which sets the extra globals aside for
the duration of the call (under a lock, since the registry is process-wide).
Callers that need one more class on purpose (Megatron's `argparse.Namespace`)
pass it in `allow`.
"""

from __future__ import annotations

import threading
from typing import IO, Any, Iterable

_REGISTRY_LOCK = threading.RLock()


def load_weights_only(
    source: str | IO[bytes], *, allow: Iterable[Any] = (), map_location: str = "cpu", **kwargs: Any
) -> Any:
    """`torch.load(source, map_location=map_location, weights_only=True, **kwargs)` with only torch's globals and \
`allow`."""
    import torch

    serialization = torch.serialization
    allow = list(allow)
    foreign = [g for g in serialization.get_safe_globals() if not _torchs_own(g)]
    if not foreign and not allow:  # nothing to set aside: no lock, so reader threads load in parallel
        return torch.load(source, map_location=map_location, weights_only=True, **kwargs)
    with _REGISTRY_LOCK:
        registered = serialization.get_safe_globals()
        serialization.clear_safe_globals()
        try:
            serialization.add_safe_globals(allow)
            return torch.load(source, map_location=map_location, weights_only=True, **kwargs)
        finally:
            serialization.clear_safe_globals()
            serialization.add_safe_globals(registered)


def _torchs_own(entry: Any) -> bool:
    """Whether a registered safe global is one torch registers itself (nested tensors, mesh layouts)."""
    obj = entry[0] if isinstance(entry, tuple) else entry
    return str(getattr(obj, "__module__", "")).split(".")[0] == "torch"
