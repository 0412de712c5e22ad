"""What the framework matrix (tests/test_families/test_frameworks_matrix.py) needs per model family.

`megatron.py` and `torchtitan.py` build each framework's own model on CPU; `models.py` says, per family,
which MaxText run a test starts from and which builder loads it.
"""
