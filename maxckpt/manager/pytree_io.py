"""Read one Orbax PyTree checkpoint (a MaxText `items/` folder) onto a target.

The manager restores full train states, selected items of them, and
params-only checkpoints; all three come down to the same steps, kept here:
find the `items/` folder, compare the target with the stored metadata (so a
wrong shape or a missing tensor is a message naming the tensor, not an Orbax
traceback or a silently padded array), build restore args from the target's
shardings (which is what makes restoring onto another mesh or device count
work), and let Orbax read only what the target asks for.

>>> params = load_params("gs://run/checkpoints/0/items", abstract_params)   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from maxckpt.containers.orbax_items import ITEMS, items_dir_at, uses_ocdbt
from maxckpt.errors import CheckpointNotFoundError, ConfigError, CorruptCheckpointError, ShapeMismatchError
from maxckpt.storage.run_dirs import COMMIT_FILE, ORBAX_TMP_SUFFIX, scan_run_dir
from maxckpt.storage.urls import as_path
from maxckpt.compat import orbax_s3
from maxckpt.compat.orbax_aligned_reads import aligned_host_buffers
from maxckpt.manager.mapped_reads import mapped_file_reads

orbax_s3.install()  # Orbax reads s3:// arrays only with it (see maxckpt.compat.orbax_s3)

logger = logging.getLogger("maxckpt.manager")

ITEM_NAME = ITEMS
OPT_STATE = "opt_state"
Key = tuple[str, ...]


# --- locating and describing a checkpoint -------------------------------------------------


def resolve_items_dir(path: str | epath.PathLike) -> epath.Path:
    """The PyTree folder of a checkpoint given as a step folder or as its `items/` folder.

    MaxText's `load_parameters_path` and `load_full_state_path` name
    `<dir>/<step>/items`; a step folder is accepted too.
    """
    p = epath.Path(path)
    if ORBAX_TMP_SUFFIX in p.name or (ORBAX_TMP_SUFFIX in p.parent.name and p.name == ITEM_NAME):
        raise CheckpointNotFoundError(
            f"{p} is an unfinished Orbax save (temporary folder); point at a committed step instead"
        )
    if not p.exists():
        raise CheckpointNotFoundError(f"checkpoint path {p} does not exist")
    item = items_dir_at(p, damaged=True)  # a damaged one too: reading it says what is missing
    if item is not None and item == as_path(p):
        return p
    if item is not None:  # p is a step folder: its save must have finished
        if not (p / COMMIT_FILE).exists() and not (epath.Path(item) / COMMIT_FILE).exists():
            raise CheckpointNotFoundError(f"{p} has no {COMMIT_FILE}: its save never finished")
        return epath.Path(item)
    latest = scan_run_dir(p, "orbax").latest
    hint = f"; it looks like a run directory: try {latest.path / ITEM_NAME}" if latest else ""
    raise CheckpointNotFoundError(
        f"{p} is not an Orbax checkpoint (no _METADATA in it or in {ITEM_NAME}/){hint}"
    )


class _ExpectedOrbaxWarnings(logging.Filter):
    """Warnings Orbax logs for things maxckpt does on purpose.

    An `items/` folder has no `_CHECKPOINT_METADATA` (that file is the
    step's), and single-replica restoring swaps the jax.Array handler.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not message.startswith(("Metadata file does not exist", "Type handler registry type"))


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
    absl_logger = logging.getLogger("absl")
    quiet = _ExpectedOrbaxWarnings()
    absl_logger.addFilter(quiet)
    try:
        yield
    finally:
        absl_logger.removeFilter(quiet)


def _missing_parts(items_dir: epath.Path) -> list[str]:
    """The files an Orbax PyTree folder needs that are gone: `_METADATA`, and with OCDBT `manifest.ocdbt` and `d/`."""
    if not (items_dir / "_METADATA").exists():
        return ["_METADATA"]
    ocdbt = uses_ocdbt(items_dir, unstated=True)  # Orbax's default; the manifest may be what is gone
    return [name for name in ("manifest.ocdbt", "d") if ocdbt and not (items_dir / name).exists()]


def _damaged(items_dir: epath.Path, what: str, err: BaseException) -> CorruptCheckpointError:
    """The error for a checkpoint whose files are gone or damaged: what is missing, TensorStore's reason (no spec)."""
    reason = str(err).split(" [tensorstore_spec=")[0].strip()[:300]
    missing = _missing_parts(items_dir)
    names = " and ".join("d/ (the array data)" if n == "d" else n for n in missing)
    gone = f"its {names} {'is' if len(missing) == 1 else 'are'} missing" if missing else (reason or "unreadable")
    return CorruptCheckpointError(
        f"cannot read the {what} of {items_dir}: {gone}{f' ({reason})' if missing and reason else ''}; "
        "the checkpoint's files are gone or damaged (an incomplete copy, a cleanup): restore another step "
        "or copy it again"
    )


def read_metadata(items_dir: epath.Path) -> Any:
    """The stored tree (nested dicts/lists of array metadata), read without touching array data.

    The handler is asked directly: Orbax's Checkpointer.metadata() logs a
    failure and returns None, which surfaced as an AttributeError.
    """
    handler = ocp.PyTreeCheckpointHandler()
    try:
        with _quiet_orbax():
            return handler.metadata(items_dir).tree
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise _damaged(items_dir, "Orbax metadata", err) from None
    finally:
        handler.close()


def step_custom_metadata(step_dir: epath.Path) -> dict[str, Any]:
    """`custom_metadata` of a step (e.g. `{"scan_layers": true}`), {} when absent or unreadable."""
    from maxckpt.storage.bounded import read_json_object

    try:
        meta = read_json_object(os.fspath(step_dir / "_CHECKPOINT_METADATA"))
    except (OSError, ValueError):  # absent, damaged, too deep or not an object: no custom metadata
        return {}
    custom = meta.get("custom_metadata")
    return dict(custom) if isinstance(custom, dict) else {}


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def flatten(tree: Any) -> dict[Key, Any]:
    """{('params', 'params', 'decoder', ...): leaf} for any pytree (None is an empty subtree)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {tuple(_key_name(k) for k in path): leaf for path, leaf in leaves}


def dotted(key: Key) -> str:
    return "/".join(key)


# --- comparing a target with what is stored -----------------------------------------------


def _shape(leaf: Any) -> tuple[int, ...]:
    return tuple(getattr(leaf, "shape", np.shape(leaf)))


def check_target(target: Mapping[Key, Any], stored: Mapping[Key, Any], where: epath.Path, prefix: Key = ()) -> None:
    """Raise ShapeMismatchError unless every target tensor exists in `stored` with its shape."""
    missing = [k for k in target if k not in stored]
    if missing:
        names = ", ".join(dotted(prefix + k) for k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        some = ", ".join(dotted(prefix + k) for k in list(stored)[:5])
        raise ShapeMismatchError(
            f"{where} lacks {len(missing)} tensor(s) the target expects: {names}{more}; "
            f"it holds e.g. {some}. Check that the target matches the model that wrote the checkpoint "
            "(scan_layers, model size, params-only vs full state)"
        )
    for key, leaf in target.items():
        want, found = _shape(leaf), tuple(getattr(stored[key], "shape", ()) or ())
        if hasattr(stored[key], "shape") and want != found:
            raise ShapeMismatchError(
                f"{dotted(prefix + key)} in {where}: the target expects shape {want}, the checkpoint holds {found}"
            )


# --- restoring ------------------------------------------------------------------------------


def _with_default_sharding(leaf: Any) -> Any:
    """Give abstract leaves without a sharding one on the first local device."""
    if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
        if jax.process_count() > 1:
            raise ShapeMismatchError(
                "a target leaf has no sharding; with several JAX processes every abstract leaf must carry one "
                "(jax.ShapeDtypeStruct(shape, dtype, sharding=...))"
            )
        return jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        )
    return leaf


def _single_replica_args(leaf: Any, args: Any) -> Any:
    """MaxText's single-replica restore: replica 0 (mesh axis 0) reads, then broadcasts to the others."""
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(args, ocp.ArrayRestoreArgs) or not isinstance(sharding, jax.sharding.NamedSharding):
        return args
    return ocp.type_handlers.SingleReplicaArrayRestoreArgs(sharding=sharding, global_shape=leaf.shape, dtype=leaf.dtype)


@contextlib.contextmanager
def _array_handler(single_replica: bool) -> Iterator[None]:
    if not single_replica:
        yield
        return
    handler = ocp.type_handlers.SingleReplicaArrayHandler(replica_axis_index=0, broadcast_memory_limit_bytes=1024**3)
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    try:
        yield
    finally:
        ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(), override=True)


def _checkpointer(concurrent_gb: int) -> ocp.Checkpointer:
    return ocp.Checkpointer(
        ocp.PyTreeCheckpointHandler(restore_concurrent_gb=concurrent_gb, save_concurrent_gb=concurrent_gb)
    )


def restore_tree(
    items_dir: epath.Path,
    target: Any,
    *,
    concurrent_gb: int = 96,
    single_replica: bool = False,
    metadata: Any = None,
) -> Any:
    """Restore the part of the checkpoint `target` describes, in `target`'s structure.

    `target` leaves may be concrete arrays or `jax.ShapeDtypeStruct`s; their
    shardings decide where the data lands (any mesh, any device count), their
    dtypes what it is cast to. Stored items the target does not name are not
    read. Pass `metadata` (:func:`read_metadata` of `items_dir`) when the
    caller has it already: on an object store with many arrays, each read
    costs real time.
    """
    if metadata is None:
        metadata = read_metadata(items_dir)
    target = jax.tree_util.tree_map(_with_default_sharding, target)
    check_target(flatten(target), flatten(metadata), items_dir)
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    if single_replica:
        restore_args = jax.tree_util.tree_map(_single_replica_args, target, restore_args)
    try:
        with _quiet_orbax(), _array_handler(single_replica), aligned_host_buffers(), mapped_file_reads(items_dir):
            return _checkpointer(concurrent_gb).restore(
                items_dir, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
            )
    except (ValueError, KeyError) as err:
        if str(err).startswith(("NOT_FOUND", "DATA_LOSS")):  # TensorStore: a data file is gone or cut short
            raise _damaged(items_dir, "array data", err) from None
        raise ShapeMismatchError(f"cannot restore {items_dir} onto the given target: {err}") from None
    except Exception as err:  # Orbax wraps a failed read in a bare Exception, the TensorStore error as its cause
        if isinstance(err.__cause__, (OSError, ValueError)) and str(err).startswith("Encountered error while reading"):
            raise _damaged(items_dir, "array data", err.__cause__) from None
        raise


# --- train-state items ------------------------------------------------------------------------


def top_items(state: Any) -> dict[str, Any]:
    """The top-level items of a train state: a mapping's entries or a dataclass's pytree fields."""
    if isinstance(state, Mapping):
        return dict(state)
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return {
            f.name: getattr(state, f.name)
            for f in dataclasses.fields(state)
            if f.metadata.get("pytree_node", True)
        }
    raise TypeError(
        f"a train state must be a mapping or a (flax struct) dataclass to select items, got {type(state).__name__}"
    )


def replace_items(state: Any, items: Mapping[str, Any]) -> Any:
    """`state` with some top-level items replaced (same type as `state`)."""
    if isinstance(state, Mapping):
        merged = {**state, **items}
        try:
            return type(state)(merged)
        except TypeError:
            return merged
    return dataclasses.replace(state, **items)


def stored_items(items_dir: epath.Path, metadata: Any = None) -> set[str]:
    """Names of the top-level items stored in `items_dir` (`metadata`: its metadata, if already read)."""
    meta = read_metadata(items_dir) if metadata is None else metadata
    return set(meta) if isinstance(meta, Mapping) else set()


# --- params-only loading ------------------------------------------------------------------------


def _unwrap_value_keys(stored: Mapping[Key, Any]) -> dict[Key, Key]:
    """Map logical names to stored names, dropping NNX's `{"value": array}` wrappers.

    Only a single-key dict whose key is `value` is unwrapped: the attention
    projection literally named `value` (`.../self_attention/value/kernel`)
    stays as it is.
    """
    from maxckpt.containers.orbax import unwrap_nnx_values

    return unwrap_nnx_values(stored)


def _params_view(stored: Mapping[Key, Any], root: Key) -> dict[Key, Key]:
    under = {k[len(root):]: v for k, v in stored.items() if k[: len(root)] == root and len(k) > len(root)}
    return {logical: root + real for logical, real in _unwrap_value_keys(under).items()}


def match_params(target_keys: Sequence[Key], stored: Mapping[Key, Any]) -> dict[Key, Key]:
    """Map each target key to a stored key, whatever the nesting of either side.

    Stored params sit under `params/params` (MaxText train states and linen
    params-only checkpoints) or at the top with `{"value": ...}` leaves
    (NNX params-only checkpoints); the target may be MaxText's
    `state.params` (`{"params": {...}}`) or the inner tree.
    """
    best: dict[Key, Key] | None = None
    for ckpt_root in (("params", "params"), ("params",), ()):
        view = _params_view(stored, ckpt_root)
        if not view:
            continue
        for target_root in (("params",), ()):
            keys = [k[len(target_root):] for k in target_keys if k[: len(target_root)] == target_root]
            if len(keys) != len(target_keys) or not keys:
                continue
            if all(k in view for k in keys):
                return {tk: view[k] for tk, k in zip(target_keys, keys)}
            hits = sum(k in view for k in keys)
            if best is None or hits > len(best):
                best = {tk: view[k] for tk, k in zip(target_keys, keys) if k in view}
    return best or {}


def load_params(
    path: str | epath.PathLike,
    target: Any,
    *,
    concurrent_gb: int = 96,
    single_replica: bool = False,
) -> Any:
    """Load only the params of a checkpoint onto `target` (MaxText's `load_parameters_path`).

    `path` is a step folder or its `items/` folder: a full train state, a
    MaxText params-only checkpoint (`generate_param_only_checkpoint`, NNX
    `{"value": ...}` leaves) or a linen one (`params/params/...`). The result
    has `target`'s structure, shardings and dtypes; optimizer state and step
    are never read.

    >>> params = load_params(".../checkpoints/0/items", state.params)   # doctest: +SKIP
    """
    items_dir = resolve_items_dir(path)
    metadata = read_metadata(items_dir)
    stored = flatten(metadata)
    target = jax.tree_util.tree_map(_with_default_sharding, target)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    if not leaves:  # None or an empty tree: nothing says which params to load, or onto what
        raise ConfigError(
            f"load_params({items_dir}): the target holds no arrays ({type(target).__name__}); pass the params "
            "tree to load onto (arrays or jax.ShapeDtypeStruct leaves, e.g. state.params)"
        )
    target_keys = [tuple(_key_name(k) for k in p) for p, _ in leaves]
    mapping = match_params(target_keys, stored)
    by_stored = {mapping[k]: leaf for k, (_, leaf) in zip(target_keys, leaves) if k in mapping}
    missing = [k for k in target_keys if k not in mapping]
    if missing:
        check_target({k: None for k in missing}, {}, items_dir)
    check_target(by_stored, stored, items_dir)
    unused = len([k for k in stored if k not in by_stored and k[:1] not in (("opt_state",), ("step",), ("nnx_aux",))])
    if unused:
        logger.warning(
            "load_params: %d stored tensor(s) of %s are not in the target and were not loaded", unused, items_dir
        )
    nested: dict[str, Any] = {}
    for key, leaf in by_stored.items():
        node = nested
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = leaf
    restored = restore_tree(
        items_dir, nested, concurrent_gb=concurrent_gb, single_replica=single_replica, metadata=metadata
    )
    flat_restored = flatten(restored)
    return jax.tree_util.tree_unflatten(treedef, [flat_restored[mapping[k]] for k in target_keys])
