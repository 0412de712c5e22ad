"""Export on completion: `save(..., final=True)` commits the final step, then converts it for the PyTorch side.

Runs use the bundled hand-off overlays (configs/handoff_*.yml) pointed at tmp
dirs, with a tiny MaxText-shaped Llama train state (params, Adam state, step).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from conversion_models import nest, random_maxtext_params, tiny_spec
from maxckpt import CheckpointManager, load_config
from maxckpt.config.loader import bundled_configs_dir
from maxckpt.containers.dcp import DcpReader
from maxckpt.conversion import open_checkpoint
from maxckpt.errors import ConversionError

pytestmark = pytest.mark.filterwarnings("ignore")


def train_state(family: str, step: int) -> tuple[dict, dict]:
    spec = tiny_spec(family)
    params = random_maxtext_params(spec, seed=step)
    tree = {"params": nest({k: jnp.asarray(v) for k, v in params.items()})}
    return {"params": tree, "opt_state": optax.adam(1e-3).init(tree), "step": jnp.asarray(step + 1, jnp.int32)}, params


def config(tmp_path, preset: str, *overrides: str):
    return load_config(
        bundled_configs_dir() / preset,
        f"base_output_directory={tmp_path}",
        "async_checkpointing=false",
        "checkpoint_period=100",
        *overrides,
    )


def test_final_save_exports_every_requested_format(tmp_path):
    cfg = config(tmp_path, "handoff_megatron.yml", "maxckpt_export_on_completion=[megatron,torchtitan,hf,torch]")
    assert cfg.model_name == "llama2-7b" and cfg.maxckpt_export_dtype == "bfloat16"
    with CheckpointManager.from_config(cfg) as mgr:
        state, _ = train_state("llama2", 0)
        assert mgr.save(0, state)
        assert not (tmp_path / "handoff_megatron" / "export").exists()  # only the final save exports
        state, params = train_state("llama2", 9)
        assert mgr.save(9, state, final=True)
        assert sorted(mgr.export_reports) == ["hf", "megatron", "torch", "torchtitan"]
        assert mgr.export_reports["megatron"].destination == tmp_path / "handoff_megatron" / "export" / "megatron"
    export = tmp_path / "handoff_megatron" / "export"
    assert sorted(p.name for p in export.iterdir()) == ["hf", "megatron", "torch", "torchtitan"]
    # The final state's step (10) is Megatron's iteration and TorchTitan's step.
    assert (export / "megatron" / "latest_checkpointed_iteration.txt").read_text() == "10"
    assert DcpReader(export / "torchtitan" / "step-10").read_object("train_state.step") == 10
    step_dir = tmp_path / "handoff_megatron" / "checkpoints" / "9"
    with open_checkpoint(step_dir, model="llama2") as source:
        expected = {n: t.read() for n, t in source.hf_tensors(np.dtype(ml_dtypes.bfloat16)).items()}
    for fmt in ("hf", "megatron", "torchtitan", "torch"):
        with open_checkpoint(export / fmt) as out:
            assert out.spec.family == "llama2", fmt
            got = out.hf_tensors()
            assert set(got) == set(expected), fmt
            for name, array in expected.items():
                value = got[name].read()
                assert value.dtype == np.dtype(ml_dtypes.bfloat16) and np.array_equal(value, array), (fmt, name)


def test_a_failed_export_raises_after_the_checkpoint_is_committed(tmp_path):
    # The llama state has no q/k norms, so exporting it as qwen3 must fail, for each format.
    cfg = config(tmp_path, "handoff_torchtitan.yml", "model_name=qwen3-0.6b", "maxckpt_export_on_completion=[torchtitan,hf]")
    state, params = train_state("llama3.1", 4)
    with CheckpointManager.from_config(cfg) as mgr:
        with pytest.raises(ConversionError) as info:
            mgr.save(4, state, final=True)
        assert mgr.all_steps() == [4]
        restored = mgr.restore()
    message = str(info.value)
    assert "committed and safe" in message and "failed for 2 of 2 format(s)" in message
    assert "has no q/k norm tensors" in message and "retry: maxckpt convert" in message
    kernel = np.asarray(restored["params"]["params"]["decoder"]["layers"]["mlp"]["wo"]["kernel"])
    assert np.array_equal(kernel, params["decoder/layers/mlp/wo/kernel"])
    export = tmp_path / "handoff_torchtitan" / "export"
    assert not export.exists() or not any(p.name.startswith(("torchtitan", "hf")) for p in export.iterdir())


def test_no_export_without_a_final_save(tmp_path):
    cfg = config(tmp_path, "handoff_hf.yml", "save_checkpoint_on_completion=false")
    with CheckpointManager.from_config(cfg) as mgr:
        state, _ = train_state("llama3.1", 2)
        assert not mgr.save(2, state, final=True)
    assert not (tmp_path / "handoff_hf" / "export").exists()
