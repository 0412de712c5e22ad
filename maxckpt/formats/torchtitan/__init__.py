"""The TorchTitan DCP format, one module per job.

- :mod:`~maxckpt.formats.torchtitan.layout`: model keys and shapes <-> HF as lazy tensors (no I/O);
- :mod:`~maxckpt.formats.torchtitan.files`: `step-N` folders, `train_state`, opening the writer;
- :mod:`~maxckpt.formats.torchtitan.notes`: what the loading run's job config must set;
- :mod:`~maxckpt.formats.torchtitan.options`: the knobs of a TorchTitan target.
"""
