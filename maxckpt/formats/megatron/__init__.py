"""The Megatron-Core `torch_dist` format, one module per job.

- :mod:`~maxckpt.formats.megatron.layout`: the walker of the families' tables (names and shapes <-> HF as lazy
  tensors, no I/O; the names and tables are :mod:`maxckpt.families.tables.megatron`);
- :mod:`~maxckpt.formats.megatron.te_spec`: what the Transformer Engine and local layer specs name differently;
- :mod:`~maxckpt.formats.megatron.support`: which models maxckpt maps (keys and saved args checked);
- :mod:`~maxckpt.formats.megatron.args`: the Megatron-LM arguments of a model (`common.pt` args, CLI flags, back);
- :mod:`~maxckpt.formats.megatron.files`: the run directory (tracker, `common.pt`, `metadata.json`, the writer);
- :mod:`~maxckpt.formats.megatron.options`: the knobs of a Megatron target.
"""
