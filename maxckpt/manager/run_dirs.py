"""Moved to :mod:`maxckpt.storage.run_dirs` (the storage layer); kept so old imports work."""

from maxckpt.storage.run_dirs import *  # noqa: F401,F403
from maxckpt.storage.run_dirs import (  # noqa: F401  (names `*` leaves out)
    _COMMON_SIDECARS,
    _CONVERSION_MARKERS,
    _DELETING_RE,
    _SIDECARS,
    _entry,
    _link_target,
    _parse_name,
    _read_megatron_tracker,
)
