"""Export the final checkpoint to the PyTorch world when training ends.

A MaxText overlay that sets

    maxckpt_export_on_completion: [hf, megatron]   # any of hf, megatron, torchtitan, torch
    maxckpt_export_dtype: bfloat16
    maxckpt_export_directory: /exports/run7        # default <base_output_directory>/<run_name>/export
    model_name: llama3.1-8b                        # picks the family (rotary layout, rope settings)

makes `CheckpointManager.save(step, state, final=True)` convert the committed
final step with :func:`maxckpt.convert` into `<export_directory>/<format>`,
on process 0 only. The checkpoint is committed before any export starts, and
an export that fails never touches it: every format is attempted, then one
:class:`~maxckpt.errors.ConversionError` names what failed and the command
that retries it. A previous export of the same format is replaced only once
the new one is complete.

>>> reports = export_checkpoint(load_config("handoff_megatron.yml"), "/runs/r/checkpoints/999")  # doctest: +SKIP
>>> reports["megatron"].destination                                                            # doctest: +SKIP
PosixPath('/tmp/maxckpt_runs/handoff_megatron/export/megatron')
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from maxckpt.config import CheckpointConfig
from maxckpt.errors import ConfigError, ConversionError
from maxckpt.storage.run_dirs import COMMIT_FILE
from maxckpt.storage.urls import as_path

if TYPE_CHECKING:
    from maxckpt.conversion.pipeline import ConversionReport

logger = logging.getLogger("maxckpt.manager")

# MaxText's `model_name: default` is its llama2-style base model.
_DEFAULT_MODEL = "llama2"


def export_model(config: CheckpointConfig) -> str:
    """The `--model` an export passes: the config's MaxText model name (`default` means llama2)."""
    return _DEFAULT_MODEL if config.model_name in ("", "default") else config.model_name


def export_checkpoint(config: CheckpointConfig, step_dir: str | os.PathLike) -> dict[str, "ConversionReport"]:
    """Convert the committed checkpoint `step_dir` to every format in `maxckpt_export_on_completion`.

    Returns one report per format. Failures are collected and raised together
    as a ConversionError once every format was tried.
    """
    from maxckpt.conversion import convert

    formats = tuple(config.maxckpt_export_on_completion)
    if not formats:
        return {}
    root = config.export_directory
    if not root:
        raise ConfigError(
            "maxckpt_export_on_completion is set but there is no export directory: set "
            "maxckpt_export_directory, or base_output_directory and run_name"
        )
    model, dtype = export_model(config), config.maxckpt_export_dtype
    reports: dict[str, ConversionReport] = {}
    failures: list[str] = []
    for fmt in formats:
        dst = as_path(root) / fmt
        logger.info("maxckpt: exporting %s to %s (%s, %s)", step_dir, dst, fmt, dtype)
        try:
            reports[fmt] = convert(step_dir, dst, to=fmt, model=model, dtype=dtype, overwrite=True)
        except Exception as err:  # noqa: BLE001 - try every format, then report them all
            failures.append(
                f"{fmt}: {type(err).__name__}: {err} (retry: maxckpt convert {step_dir} {dst} --to {fmt} "
                f"--model {model} --dtype {dtype} --overwrite)"
            )
            continue
        for note in reports[fmt].notes:
            logger.info("maxckpt: export to %s: %s", fmt, note)
    if failures:
        raise ConversionError(
            f"the final checkpoint {step_dir} is committed and safe, but exporting it failed for "
            f"{len(failures)} of {len(formats)} format(s): " + "; ".join(failures)
        )
    return reports


def export_on_completion(
    config: CheckpointConfig, checkpoint_dir: str | os.PathLike, step: int
) -> dict[str, "ConversionReport"]:
    """What `save(..., final=True)` calls after the final step is committed: export it on process 0.

    Other processes return at once (the export reads the checkpoint from
    storage and writes plain files; one writer is enough).
    """
    if not config.maxckpt_export_on_completion:
        return {}
    import jax

    if jax.process_index() != 0:
        return {}
    step_dir = as_path(checkpoint_dir) / str(step)
    if not (step_dir / COMMIT_FILE).exists():
        raise ConversionError(f"cannot export step {step}: {step_dir} is not a committed checkpoint")
    return export_checkpoint(config, step_dir)
