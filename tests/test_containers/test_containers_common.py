"""What every container promises alike: an unknown tensor name is a clear project error."""

from __future__ import annotations

import numpy as np
import pytest

from maxckpt import MaxckptError, TensorNotFoundError


def orbax_reader(tmp_path):
    import orbax.checkpoint as ocp

    from maxckpt.containers.orbax import OrbaxReader

    ocp.PyTreeCheckpointer().save(tmp_path / "items", {"w": np.ones(3, np.float32)})
    return OrbaxReader(tmp_path / "items")


def safetensors_reader(tmp_path):
    from safetensors.numpy import save_file

    from maxckpt.containers.safetensors import SafetensorsReader

    save_file({"w": np.ones(3, np.float32)}, str(tmp_path / "model.safetensors"))
    return SafetensorsReader(tmp_path / "model.safetensors")


def dcp_reader(tmp_path):
    from maxckpt.containers.dcp import DcpReader, DcpWriter

    with DcpWriter(tmp_path / "dcp") as writer:
        writer.write("w", np.ones(3, np.float32))
    return DcpReader(tmp_path / "dcp")


def torch_reader(tmp_path):
    import torch

    from maxckpt.containers.torch_file import TorchFileReader

    torch.save({"w": torch.ones(3)}, tmp_path / "model.pt")
    return TorchFileReader(tmp_path / "model.pt")


@pytest.mark.parametrize("make_reader", [orbax_reader, safetensors_reader, dcp_reader, torch_reader])
def test_unknown_tensor_name_is_a_project_error_and_a_key_error(tmp_path, make_reader):
    reader = make_reader(tmp_path)
    assert set(reader.tensors()) == {"w"}
    assert np.array_equal(reader.read("w"), np.ones(3, np.float32))
    with pytest.raises(TensorNotFoundError) as info:
        reader.read("nope")
    assert isinstance(info.value, MaxckptError) and isinstance(info.value, KeyError)
    assert "'nope'" in str(info.value) and not str(info.value).startswith('"')
