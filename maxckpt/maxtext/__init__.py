"""maxckpt inside MaxText: MaxText's own trainer, with maxckpt's checkpoint manager.

`maxckpt maxtext train overlay.yml key=value ...` (or `python -m
maxckpt.maxtext.train ...`) runs MaxText's pre-training entry point
(`maxtext.trainers.pre_train.train`) unchanged, except that the factory
MaxText calls for its checkpoint manager returns
:class:`~maxckpt.maxtext.checkpointer.MaxckptCheckpointer`: the same Orbax
checkpointer writing the same layout, with maxckpt's retention, SIGTERM
handling, export on completion and an end-of-run summary.

Needs the `maxtext` extra (Python >= 3.12). Modules:

- :mod:`~maxckpt.maxtext.overlay`: one overlay, split into MaxText's keys and maxckpt's;
- :mod:`~maxckpt.maxtext.checkpointer`: the checkpointer MaxText gets;
- :mod:`~maxckpt.maxtext.patch`: MaxText's manager factory and save hook, routed to maxckpt's
  (through :mod:`maxckpt.compat.maxtext`, which checks the MaxText it patches);
- :mod:`~maxckpt.maxtext.train`: the entry point and its summary.
"""
