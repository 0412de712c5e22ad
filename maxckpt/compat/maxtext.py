"""MaxText's checkpoint functions that maxckpt replaces or calls: checked against MaxText 0.2.5, then swapped.

Why here: :mod:`maxckpt.maxtext.patch` routes MaxText's trainer to maxckpt's checkpointer by replacing two
attributes of `maxtext.common.checkpointing` (the manager factory and the save hook). That is a feature; what
it depends on in MaxText is this module's job: :func:`check_maxtext` compares the names and parameters of
every MaxText function relied on with 0.2.5's and raises :class:`~maxckpt.errors.MaxckptError` naming the
difference, so a MaxText upgrade fails loudly instead of training without maxckpt; :func:`replace` and
:func:`restore` swap the attributes and keep MaxText's own functions.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping

from maxckpt.compat.versions import WRITTEN_FOR, written_for
from maxckpt.errors import MaxckptError

MAXTEXT_VERSION = WRITTEN_FOR["maxtext"][0]  # the MaxText maxckpt plugs into
# MaxText 0.2.5's parameter lists of what maxckpt replaces or calls.
EXPECTED_SIGNATURES: dict[str, tuple[str, ...]] = {
    "create_orbax_checkpoint_manager": (
        "checkpoint_dir", "enable_checkpointing", "use_async", "save_interval_steps", "dataset_type",
        "orbax_logger", "use_ocdbt", "use_zarr3", "enable_continuous_checkpointing",
        "max_num_checkpoints_to_keep", "checkpoint_storage_concurrent_gb", "enable_autocheckpoint",
        "todelete_subdir", "todelete_full_path", "ocdbt_target_data_file_size_bytes",
    ),
    "maybe_save_checkpoint": ("checkpoint_manager", "state", "config", "data_iterator", "step"),
    "save_checkpoint": ("checkpoint_manager", "step", "state", "config", "data_iterator", "force"),
    "wait_until_finished": ("checkpoint_manager",),
    "all_steps": ("checkpoint_manager",),
    "load_state_if_possible": (
        "checkpoint_manager", "data_iterator", "load_parameters_from_path", "load_full_state_from_path",
        "checkpoint_storage_concurrent_gb", "abstract_unboxed_pre_state", "enable_single_replica_ckpt_restoring",
        "dataset_type", "step", "use_ocdbt", "use_zarr3", "enable_orbax_v1", "checkpoint_conversion_fn",
        "source_checkpoint_layout", "expansion_factor_real_data", "maxtext_config",
    ),
}
CONTEXT_SIGNATURES: dict[str, tuple[str, ...]] = {
    "build_save_decision_policy": ("save_interval_steps", "enable_continuous_checkpointing", "enable_autocheckpoint"),
}

_ORIGINALS: dict[str, Callable] = {}  # MaxText's own functions, while replaced


def _params(fn: Callable) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def check_maxtext() -> None:
    """Raise MaxckptError unless MaxText's functions are the ones maxckpt was written against.

    >>> check_maxtext()   # doctest: +SKIP
    """
    from maxtext.common import checkpoint_context, checkpointing
    from maxtext.utils import exceptions, train_utils

    written_for("maxtext")  # another release is warned about; the signatures below decide
    problems = []
    for module, table in ((checkpointing, EXPECTED_SIGNATURES), (checkpoint_context, CONTEXT_SIGNATURES)):
        for name, expected in table.items():
            fn = _ORIGINALS.get(name) if module is checkpointing else None
            fn = fn or getattr(module, name, None)
            if fn is None:
                problems.append(f"{module.__name__}.{name} is gone")
            elif _params(fn) != expected:
                problems.append(
                    f"{module.__name__}.{name}{inspect.signature(fn)} (expected parameters {', '.join(expected)})"
                )
    if "checkpointing.create_orbax_checkpoint_manager(" not in inspect.getsource(train_utils.create_checkpoint_manager):
        problems.append(
            "maxtext.utils.train_utils.create_checkpoint_manager no longer calls "
            "checkpointing.create_orbax_checkpoint_manager"
        )
    if not hasattr(exceptions, "StopTraining"):
        problems.append("maxtext.utils.exceptions.StopTraining is gone")
    if problems:
        raise MaxckptError(
            f"this MaxText is not the one maxckpt plugs into (maxtext=={MAXTEXT_VERSION}): "
            + "; ".join(problems)
            + f". Install maxtext=={MAXTEXT_VERSION} (pip install 'maxckpt[maxtext]')"
        )


def replace(replacements: Mapping[str, Callable]) -> bool:
    """Check MaxText, then make `maxtext.common.checkpointing.<name>` each replacement; False if already replaced."""
    from maxtext.common import checkpointing

    if _ORIGINALS:
        return False
    check_maxtext()
    for name, fn in replacements.items():
        _ORIGINALS[name] = getattr(checkpointing, name)
        setattr(checkpointing, name, functools.wraps(_ORIGINALS[name])(fn))
    return True


def original(name: str) -> Callable:
    """MaxText's own `checkpointing.<name>`, while :func:`replace` has it replaced."""
    return _ORIGINALS[name]


def restore() -> None:
    """Give MaxText its own functions back."""
    from maxtext.common import checkpointing

    for name, fn in _ORIGINALS.items():
        setattr(checkpointing, name, fn)
    _ORIGINALS.clear()
