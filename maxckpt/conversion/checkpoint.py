"""Open any supported checkpoint lazily: its tensors, its model spec, its HF view.

This is the notebook entry point. Nothing is read until a tensor is asked
for, and then only that tensor (or slice):

>>> ckpt = open_checkpoint("run/checkpoints", model="llama3.1-8b")   # doctest: +SKIP
>>> ckpt.spec.num_layers, ckpt.format.name                           # doctest: +SKIP
(32, 'maxtext')
>>> q = ckpt.hf_tensors()["model.layers.0.self_attn.q_proj.weight"].read()  # doctest: +SKIP
>>> ckpt.close()                                                     # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from maxckpt.containers.read_count import CountingReader
from maxckpt.conversion import run_settings
from maxckpt.conversion.spec import build_spec
from maxckpt.errors import ShapeMismatchError, UnsupportedModelError
from maxckpt.formats import ConversionOptions, Format, detect_format, get_format
from maxckpt.storage.urls import as_path
from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec
from maxckpt.families import FAMILIES, require_bridge, resolve_model
from maxckpt.tensors import Index, LazyTensor, TensorInfo


class Checkpoint:
    """A checkpoint opened for reading: format, reader, layout and model spec.

    Opening reads metadata only; the model spec is settled on first use of
    `spec` (or of anything that maps tensors), so `tensors()` lists any
    checkpoint a format can read, even one whose model needs flags to pin
    down. Use as a context manager (or call :meth:`close`).
    """

    def __init__(self, path: Path, fmt: Format, options: ConversionOptions):
        self.path = as_path(path)
        self.format = fmt
        self.options = options
        self.layout = fmt.layout(options)
        # What this process asked the source for (a scale-out splits it: docs/scale.md).
        self.read_counter = CountingReader(fmt.open_reader(self.path, options))
        self.reader = self.read_counter
        try:
            self._infos = self.reader.tensors()
        except BaseException:
            self.reader.close()
            raise
        self._stored = self._infos  # what the files hold; `_infos` becomes the dequantized view of a quantized source
        self._model_reader = self.reader
        self.dequantized_dtype: np.dtype | None = None  # quantized weights are read in float32 (exact), or cast to this
        # A MaxText source's logit-relevant values taken from a preset (set with the spec), else None.
        self.assumed_settings: dict[str, Any] | None = None

    @property
    def spec(self) -> ModelSpec:
        """The model spec: shapes, then hints and flags (built on first use, so listing never needs it).

        Raises the conversion errors (unknown family, contradicting config,
        dims nothing states) when the checkpoint's model cannot be pinned down.
        """
        if not hasattr(self, "_spec"):
            self.check_convertible()
            try:
                dims = self.layout.infer_dims(self._infos)
            # Layouts read dims by tensor name and axis: a tree of other names or ranks fails there.
            except (KeyError, IndexError, ValueError, ZeroDivisionError) as err:
                raise UnsupportedModelError(
                    f"{self.path}: its {self.format.name} tensors do not have the names and shapes of a "
                    f"model maxckpt converts ({type(err).__name__}: {err}); maxckpt converts the "
                    f"{', '.join(FAMILIES)} decoders"
                ) from None
            hints, source = self._hints()
            hint_notes = list(hints.pop("notes", ()))
            hints, source, model, overrides, run = run_settings.settle(
                self.path, self.format.name, self.options, dims, hints, source
            )
            spec, notes = build_spec(dims, model=model, hints=hints, overrides=overrides, hints_source=source)
            if self.format.name == "maxtext":
                notes += run_settings.notes_for(spec, run, hints, overrides, model)
                if run is None:  # what outputs record as assumed (maxckpt_assumed_settings)
                    self.assumed_settings = run_settings.assumed_settings(spec, set(hints) | set(overrides), model)
            self._spec, self._notes = spec, notes + hint_notes
        return self._spec

    def check_convertible(self) -> None:
        """Raise when the stored tensors cannot be read as the model's weights (a quantized HF checkpoint maxckpt
        cannot dequantize); a quantized one it can (FP8 block, MXFP4) is from then on read dequantized.

        Runs before the spec is settled, so every command that maps tensors (convert, verify, diff) refuses
        such a checkpoint with one message; listing its tensors (`tensors()`, inspect) still works.
        """
        if hasattr(self, "_plan"):
            return
        plan = self.format.check_source(self.path, self._stored, self.options)
        if plan:
            from maxckpt.formats.hf.quantization import DequantizingReader

            self._model_reader = DequantizingReader(self.reader, plan)
            self._infos = self._model_reader.tensors()
        self._plan = plan or None

    @property
    def quantization(self) -> dict[str, Any] | None:
        """The quantized weights read dequantized (plain name -> maxckpt.formats.hf.quantization.QuantizedTensor), or \
None."""
        self.check_convertible()
        return self._plan

    def describe_quantization(self) -> str:
        """The quantization methods read dequantized, with their tensor counts ("FP8 block [128, 128]: 14 tensors")."""
        counts: dict[str, int] = {}
        for q in (self.quantization or {}).values():
            counts[q.label] = counts.get(q.label, 0) + 1
        return ", ".join(f"{label}: {n} tensors" for label, n in counts.items())

    @property
    def notes(self) -> list[str]:
        """What the user should know about how the spec was settled (guessed family, kept padding, ...)."""
        _ = self.spec
        return self._notes

    def _hints(self) -> tuple[dict[str, Any], str]:
        hints: dict[str, Any] = {}
        source = "config"
        stated = self.format.read_hints(self.path, self.reader, self.options)
        if stated is not None:  # the format keeps files that state settings (even when this one states none)
            hints.update(stated)
            source = f"{self.path} config"
        if self.options.hf_config is not None:
            from maxckpt.formats.hf.files import config_hints

            hints.update(config_hints(Path(self.options.hf_config)))
            source = str(self.options.hf_config)
        return hints, source

    @property
    def step(self) -> int | None:
        """The training step the checkpoint records (completed optimizer steps), or None.

        MaxText's `step` item (checkpoint dir N holds N + 1), TorchTitan's
        `train_state.step`, Megatron's iteration; HF and torch files have none.
        """
        if not hasattr(self, "_step"):
            self._step = self.format.read_step(self.path, self.reader, self.options)
        return self._step

    # ------------------------------------------------------------- tensors

    @property
    def bytes_read(self) -> int:
        """Bytes of the source read so far through this checkpoint (every read, checks included)."""
        return self.read_counter.bytes_read

    def tensors(self) -> dict[str, TensorInfo]:
        """Every stored tensor (native names: a quantized checkpoint's codes and scales), from metadata only."""
        return dict(self._stored)

    def read(self, name: str, index: Index | None = None) -> np.ndarray:
        """One stored tensor, or a slice of it (native name)."""
        return self.reader.read(name, index)

    def lazy_tensors(self, dtype: np.dtype | None = None) -> dict[str, LazyTensor]:
        """Native tensors as LazyTensors (optionally read in `dtype`); quantized weights dequantized, under their \
plain names."""
        self.check_convertible()
        out = {}
        for name, info in self._infos.items():
            read = lambda index, n=name: self._model_reader.read(n, index)  # noqa: E731
            t = LazyTensor(name, tuple(info.shape), info.dtype, read, chunk_shape=info.chunk_shape)
            # streamed one expert at a time
            if self._plan and name in self._plan and self._plan[name].method == "mxfp4":
                t = replace(t, pieces=tuple(((e,), functools.partial(read, (e,))) for e in range(info.shape[0])))
            if self._plan and name in self._plan and self.dequantized_dtype is not None and dtype is None:
                t = tf.lazy_cast(t, self.dequantized_dtype)  # rounded once, from the exact float32 values
            out[name] = tf.lazy_cast(t, dtype) if dtype is not None else t
        return out

    def hf_tensors(self, dtype: np.dtype | None = None) -> dict[str, LazyTensor]:
        """The model's tensors under HF names and shapes, computed lazily.

        With `dtype` wider than the stored one the stored tensors are upcast
        *before* the layout transforms (so e.g. query scaling is computed in
        the wider type); narrower dtypes are applied after them, so values are
        rounded once.
        """
        self.check_convertible()
        infos = self._infos.values()
        if self._plan and self.dequantized_dtype is not None:
            infos = [replace(i, dtype=self.dequantized_dtype) if i.name in self._plan else i for i in infos]
        upcast = dtype is not None and _widens(infos, np.dtype(dtype))
        hf = self.layout.to_hf(self.lazy_tensors(dtype if upcast else None), self.spec)
        self._refuse_integer_weights(hf)
        if dtype is not None:
            hf = {n: tf.lazy_cast(t, dtype) for n, t in hf.items()}
        return hf

    def _refuse_integer_weights(self, hf: Mapping[str, LazyTensor]) -> None:
        """Raise ShapeMismatchError when a model weight is stored in a non-float dtype.

        Why: every weight of the families maxckpt converts is floating point. Integer values (quantized
        codes, a damaged or foreign file) would pass through the layout transforms, which compute in
        float32 and cast back, and be written as if they were weights; `--dtype` (floats only) would
        not even notice. Checked on the HF view, so it holds for every source format.
        """
        for name, t in hf.items():
            dtype = np.dtype(t.dtype)
            if tf.is_float(dtype):
                continue
            if name in self._infos:
                stored = ""
            else:  # the HF name is derived: name the stored tensors that hold this dtype
                held = [n for n, i in self._infos.items() if np.dtype(i.dtype) == dtype and len(i.shape) > 0]
                shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
                stored = f" (read from {'one of ' if len(held) > 1 else ''}{shown})" if held else ""
            raise ShapeMismatchError(
                f"{self.path}: tensor {name}{stored} has dtype {dtype.name}, but a floating-point weight "
                "(bfloat16, float16 or float32) belongs there; maxckpt does not convert integer weights. "
                "If the checkpoint is quantized, dequantize it first; otherwise the file is damaged or not "
                "this model's checkpoint."
            )

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if not hasattr(self, "_spec"):
            return f"Checkpoint({str(self.path)!r}, format={self.format.name!r}, tensors={len(self._infos)})"
        return (
            f"Checkpoint({str(self.path)!r}, format={self.format.name!r}, family={self.spec.family!r}, "
            f"layers={self.spec.num_layers})"
        )


def _widens(infos, dtype: np.dtype) -> bool:
    floats = [np.dtype(i.dtype) for i in infos if tf.is_float(i.dtype)]
    return bool(floats) and dtype.itemsize > min(d.itemsize for d in floats)


def open_checkpoint(
    path: str | os.PathLike,
    *,
    format: str | None = None,
    model: str | None = None,
    step: int | None = None,
    hf_config: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
    options: ConversionOptions | None = None,
    maxtext_config: str | os.PathLike | None = None,
) -> Checkpoint:
    """Open a checkpoint of any registered format (detected unless `format` is given).

    `model` names the family (`llama3.1`) or MaxText model (`llama3.1-8b`);
    it decides what shapes cannot tell, above all MaxText's rotary layout.
    `maxtext_config` is the config a MaxText source's run was trained with
    (see :mod:`maxckpt.conversion.run_settings`).
    """
    path = as_path(path)  # absolute, `..` resolved (TensorStore refuses `..`), or a gs:// or s3:// URL
    opts = options or ConversionOptions()
    changes: dict[str, Any] = {}
    if model is not None:
        changes["model"] = model
    if step is not None:
        changes["step"] = step
    if hf_config is not None:
        changes["hf_config"] = as_path(hf_config)
    if overrides:
        changes["overrides"] = dict(overrides)
    if maxtext_config is not None:
        changes["maxtext_config"] = Path(os.path.abspath(os.fspath(maxtext_config)))
    opts = replace(opts, **changes)
    from maxckpt.storage.run_dirs import require_committed

    require_committed(path, opts.step)  # "step N is not committed" said once, for every layout
    fmt = get_format(format) if format else detect_format(path)
    if opts.model:  # a family the format cannot hold is refused with the registry's reason, before any mapping
        require_bridge(fmt.name, resolve_model(opts.model).name, "from")
    return Checkpoint(as_path(path), fmt, opts)
