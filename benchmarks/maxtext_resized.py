"""Run one of MaxText 0.2.5's converters as ``__main__`` with its HF config resized to the model's sizes.

Why: MaxText's ``to_maxtext`` takes the HF architecture from its own table
(``HF_MODEL_CONFIGS[model_name]``, the full-size model: llama3.1-8b's 32
layers), so a smaller model of the family fails on the first layer the table
has and the checkpoint lacks. ``to_huggingface`` has a flag for this
(``--override_model_architecture``, which sets the same attributes);
``to_maxtext`` has none. This wrapper sets them, then runs the module
unchanged. It runs in MaxText's Python 3.12 venv (benchmarks/vs_maxtext.py):

    python benchmarks/maxtext_resized.py '{"num_hidden_layers": 9}' llama3.1-8b \\
        maxtext.checkpoint_conversion.to_maxtext base.yml model_name=llama3.1-8b ...
"""

import json
import runpy
import sys

if __name__ == "__main__":
    sizes, model, module, *argv = sys.argv[1:]
    from maxtext.checkpoint_conversion.utils.hf_model_configs import HF_MODEL_CONFIGS

    config = HF_MODEL_CONFIGS[model]
    for key, value in json.loads(sizes).items():
        setattr(config, key, value)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
