"""Specification of CheckpointManager: cadence, MaxText's layout, resuming, MaxText-written checkpoints, params-only loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from etils import epath

from maxckpt import CheckpointManager
from maxckpt.errors import CheckpointNotFoundError, ShapeMismatchError
from maxckpt.manager import pytree_io
from manager_states import abstract, assert_same, make_state
from run_dir_builders import writable_copy


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def async_save(request) -> bool:
    return request.param


def test_saves_on_the_period_and_resumes_bit_exactly(tmp_path: Path, async_save: bool) -> None:
    with CheckpointManager(tmp_path / "ckpt", period=2, async_save=async_save) as mgr:
        assert mgr.restore(abstract(make_state(0))) is None and mgr.restored_step is None
        started = [mgr.save(step, make_state(step)) for step in range(6)]
        assert started == [True, False, True, False, True, False]
        mgr.wait()
        assert mgr.all_steps() == [0, 2, 4] and mgr.latest_step() == 4
        assert_same(mgr.restore(abstract(make_state(0))), make_state(4))
        assert mgr.restored_step == 4
        assert_same(mgr.restore(abstract(make_state(0)), step=2), make_state(2))
        assert mgr.save(5, make_state(5), force=True)
    with CheckpointManager(tmp_path / "ckpt", period=2) as again:  # a restarted run
        assert again.latest_step() == 5
        assert_same(again.restore(make_state(0)), make_state(5))


def test_final_save_of_a_step_the_period_just_saved_is_not_a_second_save(tmp_path: Path, async_save: bool) -> None:
    # The usual loop: the last step is a multiple of the period, then the final save names it again
    # while (async) the periodic save of it is still being written.
    with CheckpointManager(tmp_path / "ckpt", period=2, async_save=async_save) as mgr:
        for step in range(5):
            mgr.save(step, make_state(step))
        assert mgr.save(4, make_state(4), final=True) is False
        assert mgr.all_steps() == [0, 2, 4]
        assert_same(mgr.restore(abstract(make_state(0))), make_state(4))
    with CheckpointManager(tmp_path / "ckpt", period=2, async_save=async_save) as again:  # a restarted run
        assert again.save(4, make_state(4), force=True) is False
        assert again.save(6, make_state(6)) and again.save(6, make_state(6), final=True) is False
        assert again.all_steps() == [0, 2, 4, 6]


def test_layout_on_disk_is_maxtexts_and_plain_orbax_restores_it(tmp_path: Path) -> None:
    state = make_state(7)
    with CheckpointManager(tmp_path / "ckpt", async_save=False) as mgr:
        mgr.save(7, state)
    step_dir = tmp_path / "ckpt" / "7"
    # maxckpt's integrity manifest lies beside `items/`; plain Orbax below lists and restores the step all the same.
    assert sorted(os.listdir(step_dir)) == ["_CHECKPOINT_METADATA", "commit_success.txt", "items", "maxckpt-manifest.json"]
    assert (step_dir / "items" / "manifest.ocdbt").exists()  # OCDBT, as MaxText writes
    meta = json.loads((step_dir / "_CHECKPOINT_METADATA").read_text())
    assert meta["custom_metadata"] == {"scan_layers": True}
    # MaxText 0.2.4's resume path: a v0 CheckpointManager with the item `items`.
    plain = ocp.CheckpointManager(tmp_path / "ckpt", item_names=("items",))
    target = abstract(state)
    restored = plain.restore(
        7,
        args=ocp.args.Composite(
            items=ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target))
        ),
    )
    assert_same(restored["items"], state)
    assert plain.all_steps() == [7]
    # MaxText's load_params_from_path: params only, with the legacy `transforms={}` call.
    ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True))
    params = ckptr.restore(
        epath.Path(step_dir / "items"),
        item={"params": target["params"]},
        transforms={},
        restore_args={"params": ocp.checkpoint_utils.construct_restore_args(target["params"])},
    )
    assert_same(params["params"], state["params"])


def test_target_free_restore_returns_arrays_as_saved(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path / "ckpt", async_save=False) as mgr:
        mgr.save(3, make_state(3))
        restored = mgr.restore()
    expected = make_state(3)
    assert_same(restored["params"], expected["params"])
    assert int(restored["step"]) == 4
    assert restored["params"]["params"]["token_embedder"]["embedding"].dtype == jnp.bfloat16


# --- checkpoints MaxText wrote --------------------------------------------------------------------


def maxtext_target(items_dir: Path, drop=()):
    meta = pytree_io.read_metadata(epath.Path(items_dir))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    tree = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta)
    return {k: v for k, v in tree.items() if k not in drop}


@pytest.mark.parametrize("run", ["llama2_scan", "qwen3_scan", "mistral_scan"])
def test_resumes_runs_maxtext_wrote(maxtext_fixtures: Path, tmp_path: Path, run: str) -> None:
    src = maxtext_fixtures / run / "checkpoints"
    copy = writable_copy(src, tmp_path / "checkpoints")
    with CheckpointManager(copy, period=1) as mgr:
        latest = mgr.latest_step()
        assert latest == 5
        target = maxtext_target(src / "5" / "items")
        state = mgr.restore(target)
    assert int(state["step"]) == 6  # MaxText's step folder N holds the state after step N
    truth = ocp.PyTreeCheckpointer().restore(src / "5" / "items", args=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)))
    assert_same(state, truth)
    assert set(state) == {"params", "opt_state", "step", "nnx_aux"}


def test_restores_a_chosen_step_of_a_maxtext_run(maxtext_fixtures: Path, tmp_path: Path) -> None:
    copy = writable_copy(maxtext_fixtures / "llama2_scan" / "checkpoints", tmp_path / "checkpoints")
    with CheckpointManager(copy) as mgr:
        state = mgr.restore(maxtext_target(copy / "2" / "items", drop=("nnx_aux",)), step=2)
        assert int(state["step"]) == 3 and "nnx_aux" not in state and mgr.restored_step == 2
        with pytest.raises(CheckpointNotFoundError, match=r"step 3 has no committed checkpoint.*\[0, 2, 4, 5\]"):
            mgr.restore(step=3)


def test_load_params_reads_maxtext_params_only_checkpoints(maxtext_fixtures: Path) -> None:
    full = maxtext_fixtures / "llama2_scan" / "checkpoints" / "5"
    params_only = maxtext_fixtures / "llama2_scan_params" / "checkpoints" / "0"
    # MaxText's own target is state.params: {"params": {decoder..., token_embedder...}}, here in bf16.
    target = jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s.shape, jnp.bfloat16, sharding=s.sharding),
        maxtext_target(full / "items")["params"],
    )
    with CheckpointManager(None, config=_disabled()) as mgr:
        from_params_only = mgr.load_params(params_only / "items", target)  # NNX {"value": ...} leaves
        from_step_dir = mgr.load_params(params_only, target)  # a step folder works too
        from_full_state = mgr.load_params(full, target)  # params/params/... of a train state
        inner = mgr.load_params(params_only, target["params"])  # the inner tree as target
    # The params-only checkpoint was made from step 5 in bf16: the same bits.
    assert_same(from_params_only, from_full_state)
    assert_same(from_step_dir, from_full_state)
    assert_same(inner, from_full_state["params"])
    # And the attention projection literally named `value` is not mistaken for a wrapper.
    stored_target = maxtext_target(params_only / "items")
    stored = ocp.PyTreeCheckpointer().restore(params_only / "items", args=ocp.args.PyTreeRestore(
        item=stored_target, restore_args=ocp.checkpoint_utils.construct_restore_args(stored_target)))
    kernel = stored["decoder"]["layers"]["self_attention"]["value"]["kernel"]["value"]
    assert_same(inner["decoder"]["layers"]["self_attention"]["value"]["kernel"], kernel)


def test_load_params_mismatches_name_the_tensor(maxtext_fixtures: Path) -> None:
    params_only = maxtext_fixtures / "llama31_scan_params" / "checkpoints" / "0"
    target = maxtext_target(maxtext_fixtures / "llama2_scan" / "checkpoints" / "5" / "items")["params"]
    wrong = jax.tree_util.tree_map(lambda s: s, target)
    kernel = wrong["params"]["decoder"]["logits_dense"]["kernel"]
    wrong["params"]["decoder"]["logits_dense"]["kernel"] = jax.ShapeDtypeStruct((64, 512), kernel.dtype, sharding=kernel.sharding)
    with pytest.raises(ShapeMismatchError, match=r"decoder/logits_dense/kernel.*expects shape \(64, 512\).*holds \(64, 256\)"):
        pytree_io.load_params(params_only, wrong)
    extra = {"params": {**target["params"], "vision_encoder": {"w": kernel}}}
    with pytest.raises(ShapeMismatchError, match="lacks 1 tensor.*vision_encoder/w"):
        pytree_io.load_params(params_only, extra)
    with pytest.raises(CheckpointNotFoundError, match="looks like a run directory: try .*/checkpoints/0/items"):
        pytree_io.load_params(params_only.parent, target)
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        pytree_io.load_params(params_only / "nope", target)


def _disabled():
    from maxckpt import CheckpointConfig

    return CheckpointConfig(enable_checkpointing=False)
