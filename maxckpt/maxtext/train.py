"""`maxckpt maxtext train OVERLAY.yml [key=value ...]`: MaxText's trainer on maxckpt's manager.

    python -m maxtext.trainers.pre_train.train base.yml run_name=r steps=1000 ...
becomes
    maxckpt maxtext train overlay.yml run_name=r steps=1000 ...

MaxText's own `maxtext.trainers.pre_train.train.main` runs unchanged with the
manager factory patched (:mod:`maxckpt.maxtext.patch`). When it returns,
the final step is exported to the formats in `maxckpt_export_on_completion`
(unless the run was stopped by SIGTERM) and a summary is printed and written
to `<base_output_directory>/<run_name>/maxckpt_summary.json`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from maxckpt.errors import MaxckptError

logger = logging.getLogger("maxckpt.maxtext")

SUMMARY_FILE = "maxckpt_summary.json"


@dataclass
class RunSummary:
    """What a `maxckpt maxtext train` run did, for people and for scripts."""

    checkpoint_dir: str | None
    saved_steps: list[int] = field(default_factory=list)  # saves started by this run
    kept_steps: list[int] = field(default_factory=list)  # committed steps on disk at the end
    removed_steps: list[int] = field(default_factory=list)  # saved by this run, removed by retention
    retired_partials: list[str] = field(default_factory=list)  # killed saves moved aside at start
    retention: str = ""
    preempted_step: int | None = None  # step saved after SIGTERM, when the run was stopped
    stopped_early: str | None = None  # why the run ended before its last step (other than SIGTERM)
    exports: dict[str, str] = field(default_factory=dict)  # format -> folder
    export_error: str | None = None  # what failed in the export on completion (the checkpoint is safe)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [f"checkpoints: {self.checkpoint_dir or 'disabled'} ({self.retention})"]
        out.append(f"saved this run: {self.saved_steps or 'none'}")
        out.append(f"kept on disk: {self.kept_steps or 'none'}")
        if self.removed_steps:
            out.append(f"removed by retention: {self.removed_steps}")
        if self.retired_partials:
            out.append(f"interrupted saves moved aside: {', '.join(self.retired_partials)}")
        if self.preempted_step is not None:
            out.append(
                f"stopped by SIGTERM after committing step {self.preempted_step}; rerun the same command to resume"
            )
        if self.stopped_early:
            out.append(f"warning: {self.stopped_early}")
        for fmt, path in self.exports.items():
            out.append(f"exported {fmt}: {path}")
        out.append(f"time: {self.seconds:.1f} s")
        return out


def _require_maxtext() -> None:
    from maxckpt.compat.maxtext import MAXTEXT_VERSION
    from maxckpt.maxtext.overlay import maxtext_configs_dir

    if sys.version_info < (3, 12):
        raise MaxckptError(
            f"MaxText {MAXTEXT_VERSION} needs Python >= 3.12 and this is {sys.version.split()[0]}: "
            "run maxckpt from a Python 3.12 environment with pip install 'maxckpt[maxtext]'"
        )
    maxtext_configs_dir()


def run(overlay: str | os.PathLike, overrides: Sequence[str] = ()) -> RunSummary:
    """Train with MaxText's trainer under maxckpt's manager; returns the summary (also written to disk)."""
    _require_maxtext()
    from maxckpt.maxtext import patch
    from maxckpt.maxtext.overlay import prepare

    start = time.time()
    with tempfile.TemporaryDirectory(prefix="maxckpt-maxtext-") as work:
        prepared = prepare(overlay, list(overrides), work)
        config = prepared.config
        _check_export_deps(config)
        _record_run_config(config, overlay, overrides)  # before the first save: the run's checkpoints say what they are
        patch.install(config)
        before = len(patch.managers())
        from maxtext.trainers.pre_train import train as maxtext_train

        _run_absl_main(maxtext_train.main, prepared.maxtext_argv)
    created = patch.managers()[before:]
    manager = created[-1] if created else None
    summary = RunSummary(checkpoint_dir=None)
    if manager is not None:
        manager.close()  # waits for saves and the last retention pass
        summary.checkpoint_dir = os.fspath(manager.directory)
        summary.retention = (f"keep newest {manager.policy.keep}" if manager.policy.keep else "keep all") + (
            f", every {manager.policy.keep_period}th step" if manager.policy.keep_period else ""
        )
        summary.saved_steps = list(manager.saved_steps)
        summary.kept_steps = manager.committed_steps()
        summary.removed_steps = [s for s in summary.saved_steps if s not in summary.kept_steps]
        summary.retired_partials = list(manager.retired_partials)
        summary.preempted_step = manager.preempted_step
        if manager.sigterm_received and config.maxckpt_export_on_completion:
            # The machine is going away: no export now (the next run, or `maxckpt convert`, does it).
            logger.warning("maxckpt: SIGTERM received: export on completion skipped")
        else:
            last = _last_step(config)
            newest = summary.kept_steps[-1] if summary.kept_steps else None
            if last is not None and newest != last:
                summary.stopped_early = (
                    f"MaxText stopped before the run's last step {last} (newest committed step: "
                    f"{'none' if newest is None else newest}); "
                    "see its log above, fix the cause and rerun the same command to resume"
                )
            elif newest is not None and config.maxckpt_export_on_completion:
                from maxckpt.manager import export

                try:
                    reports = export.export_on_completion(config, summary.checkpoint_dir, newest)
                    summary.exports = {fmt: os.fspath(r.destination) for fmt, r in reports.items()}
                except MaxckptError as err:
                    summary.export_error = str(err)
    summary.seconds = time.time() - start
    _write_summary(config, summary)
    if summary.export_error:
        raise MaxckptError(summary.export_error)
    if summary.stopped_early and config.maxckpt_export_on_completion:
        raise MaxckptError(summary.stopped_early + "; the final step was not exported")
    return summary


# Formats whose writers need torch (HF safetensors do not).
_TORCH_FORMATS = ("megatron", "torchtitan", "torch")


def _check_export_deps(config: Any) -> None:
    """Refuse before training, not after it, an export this environment cannot write."""
    import importlib.util

    needs = [f for f in config.maxckpt_export_on_completion if f in _TORCH_FORMATS]
    if needs and importlib.util.find_spec("torch") is None:
        from maxckpt.errors import ConfigError

        raise ConfigError(
            f"maxckpt_export_on_completion: {', '.join(needs)} needs torch, which is not installed in this "
            "environment: install a CPU torch here, or export only hf now and convert later with "
            "`maxckpt convert RUN/checkpoints OUT --to megatron|torchtitan|torch` from an environment that has torch"
        )


def _last_step(config: Any) -> int | None:
    """The step MaxText ends on: `steps - 1` (`steps: -1` means `learning_rate_schedule_steps`)."""
    for key in ("steps", "learning_rate_schedule_steps"):
        try:
            value = int(str(config.extra.get(key, -1)).replace("_", ""))
        except ValueError:
            return None
        if value > 0:
            return value - 1
    return None


def _run_absl_main(main: Any, argv: list[str]) -> None:
    """Run MaxText's `main` as its `__main__` does (absl's app.run: flags parsed, INFO logging on)."""
    from absl import app

    def entry(parsed: Sequence[str]) -> None:
        logger.info("maxckpt: running MaxText's trainer: %s", " ".join(parsed[1:]))
        main(parsed)

    try:
        app.run(entry, argv=argv)
    except SystemExit as done:
        if done.code not in (None, 0):
            raise


def _record_run_config(config: Any, overlay: str | os.PathLike, overrides: Sequence[str]) -> None:
    """Process 0 writes the run's resolved MaxText keys to `<run>/maxckpt_run_config.yml` (what MaxText's
    `save_config_to_gcs` would write as config.yml), so `maxckpt convert RUN` needs no --model or --set.

    Written whole or not at all (a temporary file renamed into place; an object on a bucket); a run that
    cannot write it still trains, and `convert` then names what it assumes.
    """
    import jax
    import yaml

    from maxckpt.config.maxtext_run import resolve_run_config, write_record

    run_dir = config.run_directory
    if not run_dir or jax.process_index() != 0:
        return
    try:
        write_record(run_dir, resolve_run_config(overlay, list(overrides)))
    except (OSError, MaxckptError, yaml.YAMLError) as err:
        logger.warning("maxckpt: could not record the run's model settings in %s: %s", run_dir, err)


def _write_summary(config: Any, summary: RunSummary) -> None:
    import jax

    run_dir = config.run_directory
    if not run_dir or jax.process_index() != 0:
        return
    from etils import epath

    path = epath.Path(run_dir) / SUMMARY_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(summary), indent=2))
    except OSError as err:
        logger.warning("maxckpt: could not write %s: %s", path, err)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m maxckpt.maxtext.train OVERLAY.yml [key=value ...]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if args else 2)
    try:  # what `maxckpt maxtext train` does, without the CLI layer (the library never imports maxckpt.cli)
        summary = run(args[0], args[1:])
    except MaxckptError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    print("maxckpt summary")
    for line in summary.lines():
        print(line)


if __name__ == "__main__":
    main()
