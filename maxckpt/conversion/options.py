"""What a conversion is asked for besides its target's knobs: where the source's settings come from, and scale-out.

`convert(..., source=SourceOptions(...), distributed=Distributed(...))`; like the targets' options classes
(:mod:`maxckpt.formats`), each field declares its `maxckpt convert` flag once.

>>> SourceOptions(read_budget="4GB").read_budget
4000000000
>>> parse_settings(["rope_theta=1e6", "tie_word_embeddings=true"])
{'rope_theta': 1000000.0, 'tie_word_embeddings': True}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Mapping, Optional

from maxckpt.storage.bounded import loads_json
from maxckpt.errors import ConfigError
from maxckpt.formats.fields import Knobs, knob
from maxckpt.units import parse_size

DISTRIBUTED_TIMEOUT = 600.0  # seconds any process waits for the others at one point before giving up
_SCALE_OUT = "Scale-out (jax.distributed)"


def parse_settings(items: List[str]) -> dict:
    """`--set` items as settings: `["rope_theta=1e6"]` -> {"rope_theta": 1000000.0} (values as JSON when they parse)."""
    out = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: write it as KEY=VALUE, e.g. --set rope_theta=1000000")
        try:
            value = loads_json(raw)  # bounded: a value nested 100,000 deep is a string, not a crash
        except ValueError:
            value = {"True": True, "False": False, "None": None}.get(raw, raw)
        out[key.strip()] = value
    return out


@dataclass(frozen=True, kw_only=True)
class SourceOptions(Knobs):
    """How to read the source: what states the model settings shapes cannot tell, and how much to read at once."""

    hf_config: Path | None = knob(
        None, "--hf-config", type=Optional[Path],
        help="An HF config.json stating rope theta/scaling, norm eps, token ids, head counts.",
    )
    """An HF config.json stating what shapes cannot tell (rope, norm eps, token ids, head counts)."""

    overrides: Mapping[str, Any] = knob(
        None, "--set", type=List[str], from_cli=parse_settings, cli_default=[], default_factory=dict, parse=dict,
        help="Model setting KEY=VALUE, repeatable: a ModelSpec field (rope_theta=1e6) or MaxText's name "
             "(num_experts_per_tok=2, n_routing_groups=8, sliding_window_size=4, rope_max_timescale=5e5); with "
             "--maxtext-config, the run's own command-line overrides.",
    )
    """Model settings by ModelSpec field or MaxText name (`--set`), above everything else."""

    maxtext_config: Path | None = knob(
        None, "--maxtext-config", type=Optional[Path],
        help="MaxText source: the config YAML its run was trained with (base_config chain, model_name), resolved in "
             "MaxText's order with --set as the run's command-line overrides; its top-k, routing groups, windows, rope "
             "and soft caps are used instead of the --model preset. A run dir holding MaxText's config.yml, or the "
             "maxckpt_run_config.yml that maxckpt's manager and `maxckpt maxtext train` record, is read without it.",
    )
    """The config a MaxText source's run was trained with (see maxckpt.conversion.run_settings)."""

    read_budget: int | str | None = knob(
        None, "--read-budget", type=Optional[str], parse=parse_size,
        help="Memory for stacked MaxText layers read at once, e.g. 4GB (default: a quarter of RAM). Smaller holds less "
             "but may decode chunks several times.",
    )
    """Bytes of stacked layers read at once, or a size such as "4GB" (None: a quarter of RAM)."""

    format: str | None = field(default=None)
    """The source's format name (None: detected)."""


@dataclass(frozen=True, kw_only=True)
class Distributed(Knobs):
    """Scale-out over jax.distributed: `coordinator`, `num_processes` and `process_id` together, or `auto`.

    Each process writes a size-balanced share into DST (a folder they all see, or a gs:// or s3:// bucket)
    and process 0 commits it once all succeeded (:mod:`maxckpt.conversion.distributed`).
    """

    coordinator: str | None = knob(
        None, "--coordinator", type=Optional[str], panel=_SCALE_OUT,
        help="Scale-out: HOST:PORT of process 0's jax.distributed coordinator; run the same command on every process "
             "with --num-processes and --process-id. DST must be a folder all processes see, or a gs:// or s3:// URL.",
    )
    """HOST:PORT of process 0's jax.distributed coordinator."""

    num_processes: int | None = knob(
        None, "--num-processes", type=Optional[int], panel=_SCALE_OUT,
        help="Scale-out: how many processes share the conversion.",
    )
    """How many processes share the conversion."""

    process_id: int | None = knob(
        None, "--process-id", type=Optional[int], panel=_SCALE_OUT,
        help="Scale-out: this process's rank, 0 to N-1 (process 0 commits DST).",
    )
    """This process's rank, 0 to N-1 (process 0 commits DST)."""

    auto: bool = knob(
        False, "--distributed", type=bool, panel=_SCALE_OUT,
        help="Scale-out with JAX's cluster auto-detection (SLURM, Open MPI, Cloud TPU, ...) instead of the three flags "
             "above.",
    )
    """Let JAX detect the cluster (SLURM, Open MPI, Cloud TPU, ...) instead of the three settings above."""

    timeout: float = knob(
        DISTRIBUTED_TIMEOUT, "--distributed-timeout", type=float, panel=_SCALE_OUT,
        help="Scale-out: give up on a process that makes no progress for this many seconds; one whose heartbeat is "
             "silent for a quarter of it (5-100 s) is taken as dead.",
    )
    """Seconds without progress before a process is given up on; a quarter of it (5-100 s) without a heartbeat: dead."""
