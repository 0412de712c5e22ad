"""Build small run directories of every layout prune understands, with the frameworks' file formats.

TorchTitan and Megatron steps are real PyTorch DCP saves (`.metadata` last);
HF Trainer and SpecForge steps carry the files those trainers write. A
"partial" step is what a crash leaves: the data without the file written last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def dcp_save(path: Path, value: float = 1.0) -> None:
    """A real DCP checkpoint (what TorchTitan and Megatron torch_dist write)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # single process, on purpose
        dcp.save({"layers.0.w": torch.full((4, 4), value), "step": torch.tensor(int(value))}, checkpoint_id=str(path))


def torchtitan_run(root: Path, steps: list[int], partial: tuple[int, ...] = ()) -> Path:
    for step in steps:
        folder = root / f"step-{step}"
        dcp_save(folder, step)
        if step in partial:
            (folder / ".metadata").unlink()  # crashed before DCP's finish step
    return root


def megatron_run(root: Path, iterations: list[int], tracker: int | str | None, partial: tuple[int, ...] = ()) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for it in iterations:
        folder = root / f"iter_{it:07d}"
        dcp_save(folder, it)
        (folder / "metadata.json").write_text(
            json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                        "common_backend": "torch", "common_backend_version": 1})
        )
        if it in partial:
            (folder / ".metadata").unlink()
    if tracker is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(str(tracker))
    return root


def hf_trainer_run(root: Path, steps: list[int], best: int | None = None, partial: tuple[int, ...] = ()) -> Path:
    from safetensors.numpy import save_file

    for step in steps:
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        save_file({"w": np.full((2, 2), step, np.float32)}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text("{}")
        if step not in partial:
            best_path = str(root / f"checkpoint-{best}") if best is not None else None
            (folder / "trainer_state.json").write_text(
                json.dumps({"global_step": step, "best_model_checkpoint": best_path, "log_history": []}, indent=2)
            )
    return root


def specforge_run(root: Path, epoch_steps: list[tuple[int, int]], partial: tuple[int, ...] = ()) -> Path:
    import torch
    from safetensors.numpy import save_file

    for epoch, step in epoch_steps:
        folder = root / f"epoch_{epoch}_step_{step}"
        folder.mkdir(parents=True)
        torch.save({"epoch": epoch, "global_step": step}, folder / "training_state.pt")
        if step not in partial:  # save_pretrained comes after training_state.pt
            (folder / "config.json").write_text("{}")
            save_file({"w": np.full((2, 2), step, np.float32)}, str(folder / "model.safetensors"))
    return root


def names(root: Path) -> list[str]:
    return sorted(os.listdir(root))


def writable_copy(src: Path, dst: Path) -> Path:
    """Copy read-only fixtures so a test may write and delete next to them."""
    import shutil

    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for folder, dirs, _ in os.walk(dst):
        os.chmod(folder, 0o755)
    return dst


def maxtext_run(fixtures: Path, root: Path, steps: dict[int, int] | None = None) -> Path:
    """A MaxText run directory made of the real llama2_scan checkpoints.

    `steps` maps a new step number to one of the fixture steps {0, 2, 4, 5}
    (default: the fixture's own steps).
    """
    source = fixtures / "llama2_scan" / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for new, old in (steps or {s: s for s in (0, 2, 4, 5)}).items():
        writable_copy(source / str(old), root / str(new))
    return root


def tree_snapshot(root: Path) -> dict[str, tuple]:
    """Every entry below `root` (never following links): kind, size, content hash or link target.

    Two equal snapshots mean a command changed nothing a user could notice.
    """
    import hashlib

    snap: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                snap[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                snap[rel] = ("dir", st.st_mode & 0o7777)
            else:
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                snap[rel] = ("file", st.st_size, st.st_mode & 0o7777, digest)
    return snap
