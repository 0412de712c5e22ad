"""`maxckpt demo`: a tiny MaxText-layout Llama trained, crashed, resumed, pruned and exported, on local files.

- :mod:`maxckpt.demo.model`: the model (maxckpt's JAX reference of MaxText's decoder), optax, synthetic data
- :mod:`maxckpt.demo.train`: the training process (`python -m maxckpt.demo.train`) under `CheckpointManager.from_config`
- :mod:`maxckpt.demo.child`: running it as a child process and SIGKILLing it at a chosen step
- :mod:`maxckpt.demo.runner`: the whole story (:func:`~maxckpt.demo.runner.run_demo`)
- :mod:`maxckpt.demo.report`: what happened, as data and as the closing summary tables
- :mod:`maxckpt.demo.workdir`: the output directory, never clobbering one the demo did not make
"""

# The CLI's defaults too: kept here, where importing them costs nothing (`maxckpt --help` stays fast).
DEFAULT_DIR = "maxckpt_demo"
DEFAULT_STEPS = 40
