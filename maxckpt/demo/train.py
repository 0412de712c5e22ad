"""The demo's training process: `python -m maxckpt.demo.train --config OVERLAY [--set k=v ...] --steps N`.

A plain JAX training loop under maxckpt's manager, configured only by the
MaxText overlay: it resumes from the newest committed checkpoint when there
is one (a fresh start otherwise), saves on the configured period (async),
and saves the final step, which the manager then exports to the formats
the overlay names (`maxckpt_export_on_completion`). It reports each step on stdout as one JSON line
prefixed with :data:`EVENT_PREFIX`, so the demo's parent process can draw
progress; with `--pause-after STEP` it stops after reporting that step and
waits for the parent's SIGKILL (the injected crash).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

EVENT_PREFIX = "MAXCKPT_DEMO_EVENT "


def emit(event: str, **fields: Any) -> None:
    """One event line on stdout, flushed at once (the parent may kill us any moment)."""
    sys.stdout.write(EVENT_PREFIX + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def wait_to_be_killed() -> None:
    """Block until the parent's SIGKILL lands; exit if the parent goes away instead.

    Waiting pins the crash to the reported step however slowly the parent
    reads (a busy machine must not let training run on into the next save);
    the async save started at this step goes on in the background meanwhile,
    and may or may not commit before the kill.
    """
    sys.stdin.read()  # returns at EOF only: the parent closed its end without killing us
    sys.exit("maxckpt demo: the parent process went away before the injected crash")


def train(config_path: str, overrides: list[str], steps: int, seed: int = 0, pause_after: int | None = None) -> None:
    import jax

    from maxckpt import CheckpointManager, load_config
    from maxckpt.demo import model

    cfg = load_config(config_path, *overrides)
    spec = model.demo_spec(cfg.model_name)
    train_step = model.make_train_step(spec)
    with CheckpointManager.from_config(cfg) as mgr:
        fresh = model.init_state(spec, seed)
        # The target carries structure, dtypes and shardings: restore lands where `fresh` lives.
        abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), fresh)
        restored = mgr.restore(target=abstract)
        state = fresh if restored is None else restored
        start = 0 if mgr.restored_step is None else mgr.restored_step + 1
        emit(
            "start",
            resumed_from=mgr.restored_step,
            start=start,
            steps=steps,
            pid=os.getpid(),
            stored_step=int(state["step"]),
        )
        for step in range(start, steps):
            state, loss = train_step(state, model.batch(step, spec, seed))
            t0 = time.perf_counter()
            saved = mgr.save(step, state)
            emit("step", step=step, loss=float(loss), saved=bool(saved), save_blocking_s=time.perf_counter() - t0)
            if step == pause_after:
                wait_to_be_killed()
        emit("finishing", step=steps - 1, exports=list(cfg.maxckpt_export_on_completion))
        if set(cfg.maxckpt_export_on_completion) & {"megatron", "torchtitan", "torch"}:
            import torch  # noqa: F401 - imported here so the export times below are conversion, not import
        t0 = time.perf_counter()
        # The final save waits for the commit, then exports to maxckpt_export_on_completion's formats.
        final = mgr.save(steps - 1, state, final=True)
        emit("final_save", step=steps - 1, saved=bool(final), seconds=time.perf_counter() - t0)
        for fmt, report in mgr.export_reports.items():
            emit("export", format=fmt, seconds=report.seconds)
    emit("done")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m maxckpt.demo.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="MaxText overlay (e.g. configs/demo.yml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="key=value override")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pause-after",
        type=int,
        default=None,
        help="after reporting this step, wait to be killed (the injected crash)",
    )
    args = parser.parse_args(argv)
    train(args.config, args.overrides, args.steps, args.seed, args.pause_after)


if __name__ == "__main__":
    main()
