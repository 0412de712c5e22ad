"""Scale-out conversion: N processes, joined by jax.distributed, each write a size-balanced share.

Why jax.distributed: MaxText jobs already run on it, and only its coordination service is used (key-value store
and liveness), so every process may be a plain CPU host. Every process computes the same plan
(:func:`plan_shares`), writes its share into process 0's staging folder (or in place on a bucket), and process 0
writes what spans the shares and commits only when all succeeded; any failure stops the others, and every wait
is bounded. See docs/design/distributed-conversion.md (users: docs/conversion.md, "Scale-out").

>>> plan_shares([10, 1, 7, 3], 2)
[0, 0, 1, 1]
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from maxckpt.compat import jax_distributed, jax_service
from maxckpt.conversion.options import DISTRIBUTED_TIMEOUT
from maxckpt.errors import ConversionError, MaxckptError
from maxckpt.tensors import LazyTensor, TensorInfo

if TYPE_CHECKING:
    from rich.progress import Progress

    from maxckpt.formats import ConversionOptions, Format
    from maxckpt.layouts.base import ModelSpec

DEFAULT_TIMEOUT = DISTRIBUTED_TIMEOUT  # seconds any process waits for the others at one point before giving up
_POLL_MS = 500
_ADDRESS_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_runs = itertools.count()  # conversions in this process; every process counts the same ones


@dataclass(frozen=True)
class DistributedRequest:
    """How to join the other processes: explicit, or (all None) JAX's cluster auto-detection."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    heartbeat_timeout: int = 100  # seconds without a heartbeat before a process counts as dead


def distributed_request(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    distributed: bool = False,
    timeout: float | None = None,
    heartbeat_timeout: int | None = None,
) -> DistributedRequest | None:
    """Check the scale-out arguments; None when the user asked for one process.

    The three explicit settings go together; `distributed=True` alone asks JAX
    to detect the cluster from the environment.
    """
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    if not distributed and all(v is None for v in given.values()):
        return None
    if any(v is not None for v in given.values()):
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise ConversionError(
                f"--{' --'.join(m.replace('_', '-') for m in missing)} missing: a multi-process conversion needs "
                "--coordinator HOST:PORT, --num-processes N and --process-id I together "
                "(or --distributed alone, to let JAX detect the cluster)"
            )
        assert num_processes is not None and process_id is not None and coordinator is not None
        if num_processes < 1:
            raise ConversionError(f"--num-processes must be >= 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise ConversionError(
                f"--process-id {process_id} is out of range for --num-processes {num_processes}: use 0 to "
                f"{num_processes - 1}"
            )
        m = _ADDRESS_RE.match(coordinator)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise ConversionError(f"--coordinator {coordinator!r}: write it as HOST:PORT, e.g. 10.0.0.1:1234")
    if timeout is not None and timeout <= 0:
        raise ConversionError(f"the distributed timeout must be > 0 seconds, got {timeout}")
    return DistributedRequest(
        coordinator,
        num_processes,
        process_id,
        float(timeout) if timeout is not None else DEFAULT_TIMEOUT,
        int(heartbeat_timeout)
        if heartbeat_timeout is not None
        else int(min(100, max(5, (timeout or DEFAULT_TIMEOUT) / 4))),
    )


_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # HF `model.layers.3.`, TorchTitan `layers.3.`


def layer_of(name: str) -> int | None:
    """The decoder layer an output tensor belongs to, from its name; None for stacked or global tensors.

    >>> layer_of("model.layers.12.mlp.up_proj.weight"), layer_of("model.embed_tokens.weight")
    (12, None)
    """
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def plan_shares(sizes: Sequence[int], processes: int, layers: Sequence[int | None] | None = None) -> list[int]:
    """The process writing each tensor. Deterministic, so every process computes the same plan from the same sizes.

    Without `layers` (or with fewer layers than processes): largest first, to
    the least loaded process (ties: lowest rank). With each tensor's decoder
    layer (None: not in a layer): the tensors outside layers that way first,
    then every process a contiguous run of whole layers filling it up to an
    equal share of all bytes, so what a process reads of a stacked source is
    one run of its layers, never a neighbour's (:func:`layer_windows`).

    >>> plan_shares([4, 4, 4, 4, 6], 2, [0, 1, 2, 3, None])
    [0, 1, 1, 1, 0]
    """
    loads = [0] * processes
    owner = [0] * len(sizes)
    layered = layers is not None and len({x for x in layers if x is not None}) >= processes
    rest = [i for i in range(len(sizes)) if not layered or layers[i] is None]  # type: ignore[index]
    for i in sorted(rest, key=lambda i: (-int(sizes[i]), i)):
        rank = min(range(processes), key=lambda r: (loads[r], r))
        owner[i] = rank
        loads[rank] += int(sizes[i])
    if not layered:
        return owner
    assert layers is not None
    per_layer: dict[int, int] = {}
    for i, layer in enumerate(layers):
        if layer is not None:
            per_layer[layer] = per_layer.get(layer, 0) + int(sizes[i])
    share = sum(int(x) for x in sizes) / processes
    # Process r takes the layers whose middle byte falls below its cumulative capacity (share - what it holds).
    ends = list(itertools.accumulate(max(0.0, share - load) for load in loads))
    rank_of, done = {}, 0
    for layer in sorted(per_layer):
        middle = done + per_layer[layer] / 2
        rank_of[layer] = next((r for r, end in enumerate(ends) if middle < end), processes - 1)
        done += per_layer[layer]
    for i, layer in enumerate(layers):
        if layer is not None:
            owner[i] = rank_of[layer]
    return owner


def layer_window(names: Sequence[str], owner: Sequence[int], rank: int) -> tuple[int, int] | None:
    """Layers [lo, hi) process `rank` writes when they are one run and it writes every tensor of them; else None."""
    mine = {layer_of(n) for n, r in zip(names, owner) if r == rank} - {None}
    if not mine:
        return None
    lo, hi = min(mine), max(mine) + 1  # type: ignore[type-var, operator]
    others = {layer_of(n) for n, r in zip(names, owner) if r != rank}
    return (lo, hi) if len(mine) == hi - lo and not any(x is not None and lo <= x < hi for x in others) else None


@dataclass(frozen=True)
class Share:
    """This process's part of a multi-process conversion, as writers see it (`ConversionOptions.share`)."""

    rank: int
    size: int
    infos: tuple[TensorInfo, ...]  # every output tensor, in write order
    owner: Mapping[str, int]  # tensor name -> process writing it

    def infos_of(self, rank: int) -> list[TensorInfo]:
        return [i for i in self.infos if self.owner[i.name] == rank]

    @property
    def mine(self) -> list[TensorInfo]:
        return self.infos_of(self.rank)


class PeerFailure(ConversionError):
    """Another process (or this one, as seen by the others) failed: the conversion stops everywhere."""


class Group:
    """The processes of one conversion, over jax.distributed's coordination service (key-value store)."""

    def __init__(self, client: Any, rank: int, size: int, timeout: float, started: bool, heartbeat_timeout: float):
        self.client, self.rank, self.size, self.timeout, self.started = client, rank, size, timeout, started
        self.heartbeat_timeout = heartbeat_timeout
        self.prefix = f"maxckpt/convert/{next(_runs)}/"
        self._last_check = 0.0
        self._failed_here = False
        self._progress = 0  # published while writing: a slow process that still moves is waited for
        # What this process last saw of each other process: (heartbeat, progress) values and when they changed.
        self._seen: dict[int, dict[str, tuple[str | None, float]]] = {}
        # Liveness: a counter published every second from a thread. (jax's get_live_nodes cannot serve: it
        # is a barrier that returns only once every live process has called it.)
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="maxckpt-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        beat = 0
        while not self._stop.wait(0 if beat == 0 else 1.0):
            beat += 1
            try:
                self.publish(f"beat/{self.rank}", str(beat))
            except Exception:  # noqa: BLE001 - the coordinator is gone; the main thread's next call says so
                return

    # -- joining and leaving

    @classmethod
    def join(cls, request: DistributedRequest) -> "Group":
        """Join (or start) jax.distributed; a runtime the caller started already is used as is."""
        import jax

        started = False
        if not jax.distributed.is_initialized():
            _initialize(request)
            started = True
        state = jax_distributed.runtime_state()
        rank, size = int(state.process_id), int(state.num_processes)
        if request.num_processes is not None and (size, rank) != (request.num_processes, request.process_id):
            raise ConversionError(
                f"jax.distributed already runs as process {rank} of {size}, not {request.process_id} of "
                f"{request.num_processes}"
            )
        group = cls(state.client, rank, size, request.timeout, started, request.heartbeat_timeout)
        if started:
            try:
                group._agree_on_size()
            except BaseException:
                if group.rank != 0:
                    with contextlib.suppress(Exception):
                        group.publish(f"stopped/{group.rank}", "1")
                group.leave()
                raise
        return group

    def _agree_on_size(self) -> None:
        """Every process was given the same number of processes (JAX only checks that each id is below process 0's)."""
        self.publish(f"size/{self.rank}", str(self.size))
        for rank in range(1, self.size) if self.rank == 0 else (0,):
            theirs = self.wait(f"size/{rank}", rank)
            if theirs != str(self.size):
                peer, says, zero = (rank, theirs, self.size) if self.rank == 0 else (self.rank, self.size, theirs)
                raise ConversionError(  # the same line on both sides
                    f"process {peer} says --num-processes {says}, process 0 says {zero}: "
                    "give every process the same --num-processes"
                )

    def leave(self) -> None:
        """Stop the heartbeat; shut jax.distributed down if this conversion started it."""
        self._stop.set()
        self._beat.join(timeout=5)
        if not self.started:
            return
        import jax

        if self.rank == 0:
            # Process 0 hosts the coordination service: stopping it while another process still reads the
            # verdict or disconnects makes JAX abort that process. Wait (bounded) until those that finished
            # (they say so under `stopped/`) are gone; a hung or dead one is not waited for. First wait (bounded)
            # until every live process has said so: one still reading the verdict has not yet.
            self.wait_stopped()
            with contextlib.suppress(Exception):
                done = sorted({r for r, _ in self._entries("stopped/")} - {0})
                if done:
                    # Returns once each of them has disconnected (they never call it); bounded by a thread join.
                    waiter = threading.Thread(target=lambda: self.client.get_live_nodes([0, *done]), daemon=True)
                    waiter.start()
                    waiter.join(timeout=30)
        try:
            jax.distributed.shutdown()
        except Exception:  # noqa: BLE001 - the coordinator is gone: drop the client, or atexit tries again
            jax_distributed.forget_runtime()

    # -- the key-value store

    def publish(self, key: str, value: str) -> None:
        self.client.key_value_set(self.prefix + key, value, allow_overwrite=True)

    def _entries(self, directory: str) -> list[tuple[int, str]]:
        return [(int(k.rsplit("/", 1)[-1]), v) for k, v in self.client.key_value_dir_get(self.prefix + directory)]

    def _lost(self, err: BaseException) -> PeerFailure:
        return PeerFailure(f"lost contact with the coordination service (process 0): {_first_line(err)}")

    def failures(self) -> dict[int, str]:
        """Errors posted by any process so far, by rank."""
        try:
            return dict(self._entries("failed/"))
        except Exception as err:  # noqa: BLE001
            raise self._lost(err) from None

    def _stale(self, rank: int, what: str) -> float:
        """Seconds since `rank`'s `what` ("beat" or "progress") value last changed, as seen from here."""
        try:
            value = self.client.key_value_try_get(self.prefix + f"{what}/{rank}")
        except Exception as err:  # noqa: BLE001
            if "NOT_FOUND" not in str(err):
                raise self._lost(err) from None
            value = None
        now = time.monotonic()
        last, since = self._seen.setdefault(rank, {}).get(what, (None, now))
        if value != last or what not in self._seen[rank]:
            self._seen[rank][what] = (value, now)
            return 0.0
        return now - since

    def _dead(self) -> set[int]:
        return {r for r in range(self.size) if r != self.rank and self._stale(r, "beat") > self.heartbeat_timeout}

    def check(self, every: float = 0.5) -> None:
        """Raise if another process failed or died (called between tensors; at most every `every` s)."""
        now = time.monotonic()
        if now - self._last_check < every:
            return
        self._last_check = now
        self._progress += 1
        self.publish(f"progress/{self.rank}", str(self._progress))
        failed = {r: m for r, m in self.failures().items() if r != self.rank}
        if failed:
            raise PeerFailure(_failure_line(failed, self.size))
        dead = self._dead()
        if dead:
            raise PeerFailure(_dead_line(dead, self.size))

    def fail(self, message: str) -> None:
        """Tell every process that this one failed (they stop at their next check)."""
        self._failed_here = True
        with contextlib.suppress(Exception):
            self.publish(f"failed/{self.rank}", message)

    def wait(self, key: str, rank: int, *, watch_failures: bool = True) -> str:
        """The value `rank` publishes under `key`; raises when it failed, died or made no progress for the timeout."""
        started = time.monotonic()
        while True:
            try:
                return self.client.blocking_key_value_get(self.prefix + key, _POLL_MS)
            except Exception as err:  # noqa: BLE001 - DEADLINE_EXCEEDED: not there yet
                if "DEADLINE_EXCEEDED" not in str(err):
                    raise self._lost(err) from None
            if watch_failures:
                failed = {r: m for r, m in self.failures().items() if r != self.rank}
                if failed:
                    raise PeerFailure(_failure_line(failed, self.size))
            if self._stale(rank, "beat") > self.heartbeat_timeout:
                raise PeerFailure(_dead_line({rank}, self.size))
            if min(self._stale(rank, "progress"), time.monotonic() - started) > self.timeout:
                raise PeerFailure(
                    f"process {rank} of {self.size} made no progress for {self.timeout:g} s (hung?); "
                    "raise the limit with --distributed-timeout"
                )

    def agree(self, key: str) -> None:
        """Barrier: every process reports `key` done; raises on every process if any failed or vanished."""
        self.publish(f"{key}/{self.rank}", "ok")
        for rank in range(self.size):
            if rank != self.rank:
                self.wait(f"{key}/{rank}", rank)

    def wait_stopped(self) -> set[int]:
        """Process 0: give the others (bounded) time to stop (writing, when failing; reading the verdict, when leaving).

        Returns the processes that may still be running (neither stopped nor dead) when the wait ends.
        """
        deadline = time.monotonic() + min(self.timeout / 2, 30.0)
        waiting = set(range(1, self.size))
        with contextlib.suppress(Exception):
            while time.monotonic() < deadline:
                stopped = {r for r, _ in self._entries("stopped/")}
                waiting = set(range(1, self.size)) - stopped - self._dead()
                if not waiting:
                    return waiting
                time.sleep(0.2)
        return waiting


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _failure_line(failed: Mapping[int, str], size: int) -> str:
    rank = min(failed)
    return f"process {rank} of {size} failed: {failed[rank]}"


def _dead_line(dead: set[int], size: int) -> str:
    listed = ", ".join(str(r) for r in sorted(dead))
    return f"process {listed} of {size} stopped (killed or crashed) before the conversion finished"


def _initialize(request: DistributedRequest) -> None:
    """`jax.distributed.initialize`, bounded by the timeout, failing with one ConversionError instead of a SIGABRT.

    JAX's client, when joining fails (a peer never starts, an id process 0
    does not expect), calls its missed-heartbeat callback, whose default
    terminates the process (SIGABRT, a C++ stack, no error line). With a
    callback given, `connect()` raises instead; the reason is the agent's
    status, which its `shutdown()` reports. Joining waits at most
    `request.timeout` seconds (`--distributed-timeout`) plus a few.
    """
    import jax

    # Keep running when a peer dies, so this process can report it and clean up instead of aborting.
    jax.config.update("jax_enable_recoverability", True)
    timeout = max(1, int(request.timeout))
    # Process 0 runs the coordination service in a child that outlives it long enough for the others to see it die
    # (heartbeat), stop with one error and clean up, instead of JAX aborting them (maxckpt.compat.jax_service).
    heartbeat = request.heartbeat_timeout
    linger = 2 * heartbeat + min(request.timeout / 2, 30.0) + 30.0
    try:
        with jax_distributed.failed_joins_raise(), jax_service.service_in_child(linger):
            jax.distributed.initialize(
                coordinator_address=request.coordinator,
                num_processes=request.num_processes,
                process_id=request.process_id,
                initialization_timeout=timeout,
                heartbeat_timeout_seconds=request.heartbeat_timeout,
                shutdown_timeout_seconds=max(1, min(timeout, 30)),
            )
        return
    except (RuntimeError, ValueError, TypeError) as err:
        failure = err
    state = jax_distributed.runtime_state()
    status = _first_line(failure)
    if state.client is not None:  # connect() failed: the agent's status says why; drop it so atexit does not retry
        try:
            state.client.shutdown()
        except Exception as err:  # noqa: BLE001
            status = (
                str(err).partition("Agent status: ")[2].removeprefix("%s").strip().splitlines()[0]
                if "Agent status" in str(err)
                else _first_line(err)
            )
    if state.service is not None:
        with contextlib.suppress(Exception):
            state.service.shutdown()
    jax_distributed.forget_runtime()
    raise ConversionError(_join_failure(request, state, status, timeout)) from None


def _join_failure(request: DistributedRequest, state: Any, status: str, timeout: int) -> str:
    """The one line that says why joining failed and what to do."""
    address = request.coordinator or state.coordinator_address
    n, rank = request.num_processes or state.num_processes, request.process_id
    if rank is None:
        rank = state.process_id
    if (
        address is None
        or n is None
        or rank is None
        or "Unexpected task" not in status
        and "DEADLINE_EXCEEDED" not in status
        and "bad_cast" not in status
    ):
        where = f" at {address}" if address else " (cluster auto-detection)"
        return f"cannot join the other conversion processes{where}: {status}"
    if "Unexpected task" in status:
        return (
            f"process {rank} is not one of the processes the coordinator at {address} expects: process 0 was given "
            f"fewer than --num-processes {n}; give every process the same --num-processes"
        )
    again = f"raise --distributed-timeout (now {timeout} s) if they start later"
    if rank == 0:
        missing = (
            f"process 1 of {n} never joined"
            if n == 2
            else f"not all {n} processes joined (processes 1 to {n - 1} are expected)"
        )
        return (
            f"{missing} within {timeout} s: start each with the same command and its --process-id "
            f"(--coordinator {address} --num-processes {n}), check they have the same --num-processes, or {again}"
        )
    if not _reachable(address):
        return (
            f"the coordinator at {address} (process 0) did not answer within {timeout} s: start process 0 with "
            f"--coordinator {address} --num-processes {n} --process-id 0, or check --coordinator"
        )
    return (
        f"not all {n} processes joined at {address} within {timeout} s: start the missing ones, "
        f"check every process has --num-processes {n}, or {again}"
    )


def _reachable(address: str) -> bool:
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------- the pipeline's hook


def _watched(t: LazyTensor, group: Group) -> LazyTensor:
    """`t`, checking before each read that no other process failed (so a failure stops everyone soon)."""

    def fn(index, _fn=t.fn):
        group.check()
        return _fn(index)

    pieces = None
    if t.pieces is not None:
        pieces = tuple((index, (lambda f=f: (group.check(), f())[1])) for index, f in t.pieces)
    return dataclasses.replace(t, fn=fn, pieces=pieces)


def refuse_target(target: "Format", dst: str | os.PathLike) -> None:
    """Targets a multi-process conversion cannot write (before anything is read or joined)."""
    if target.name == "torch" and Path(os.fspath(dst)).suffix in (".pt", ".pth", ".bin"):
        raise ConversionError(
            f"--to torch into one file ({Path(os.fspath(dst)).name}) is written by one process: give several "
            "processes a folder DST (each writes its pytorch_model-*.bin shards), or run it without "
            "--num-processes/--distributed"
        )


def write_output(
    group: Group,
    *,
    dst: Path | str,
    overwrite: bool,
    notes: list[str],
    target: "Format",
    spec: "ModelSpec",
    tensors: Mapping[str, LazyTensor],
    options: "ConversionOptions",
    sidecar_options: "ConversionOptions",
    write: Callable[[Any, Mapping[str, LazyTensor], "Progress | None"], int],
    progress: "Progress | None" = None,
    read_within: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Write this process's share of `tensors` and commit DST once all succeeded; returns (tensors, bytes) written here.

    `write(writer, tensors, progress)` is the pipeline's streaming writer;
    `read_within(lo, hi)` (the source layout's) is told the layers this
    process converts when they are one run (:func:`layer_window`). DST
    is a folder every process sees (written in process 0's staging folder,
    renamed at the end) or a bucket URL (written in place, committed with a
    marker: :func:`_bucket_destination`).
    """
    from maxckpt.conversion.writing import write_and_close, written_info
    from maxckpt.storage import outputs
    from maxckpt.storage.urls import is_url

    infos = tuple(written_info(t) for t in tensors.values())  # as one process tells its writer (chunk = one piece)
    names = [i.name for i in infos]
    owners = plan_shares([i.nbytes for i in infos], group.size, [layer_of(n) for n in names])
    share = Share(group.rank, group.size, infos, {i.name: r for i, r in zip(infos, owners)})
    window = layer_window(names, owners, group.rank)
    if window is not None and read_within is not None:
        read_within(*window)  # stacked source tensors are read only over this process's layers
    options = dataclasses.replace(options, share=share)
    mine = {n: _watched(t, group) for n, t in tensors.items() if share.owner[n] == group.rank}
    bucket, native = is_url(dst), target.name in outputs.NATIVE_FORMATS

    def write_share(tmp: Path) -> tuple[int, Any]:
        writer = target.open_writer(tmp, spec, list(infos), options)
        return write_and_close(writer, lambda: write(writer, mine, progress)), writer

    if group.rank == 0:
        written = 0
        try:
            with (
                _bucket_destination(group, dst, overwrite, native)
                if bucket
                else _shared_destination(group, dst, overwrite, notes) as tmp
            ):
                written, writer = write_share(tmp)
                group.agree("written")  # every share is in DST (uploaded, for a bucket)
                # What spans the shares: the HF index, DCP `.metadata`, Orbax's merged OCDBT manifest and _METADATA.
                writer.finish_shares(share)
                target.write_sidecars(tmp, spec, sidecar_options)
        except BaseException as err:
            message = _message(err)
            if not isinstance(err, PeerFailure) and not group._failed_here:
                group.fail(message)
            group.publish("committed", "error\n" + message)
            # The output is removed by now; the others stopped writing (they saw the failure).
            raise (err if isinstance(err, MaxckptError) else ConversionError(message)) from None
        group.publish("committed", "ok")
        return len(mine), written

    staging: str | None = None
    token: str | None = None  # a bucket DST's `writing` record, process 0's: cleaned up with it should it die
    try:
        staging = group.wait("staging", 0)
        if bucket:  # each process uploads its own share into the bucket DST process 0 prepared
            token = outputs.writing_token(staging)
            with outputs.spooled(staging, native=native) as tmp:
                written, _ = write_share(tmp)
        else:
            written, _ = write_share(Path(staging))
        group.agree("written")
        group.publish(f"stopped/{group.rank}", "1")
        verdict = group.wait("committed", 0, watch_failures=False)
    except BaseException as err:
        message = _message(err)
        if not isinstance(err, PeerFailure):
            group.fail(message)
        group.publish(f"stopped/{group.rank}", "1")
        if staging is not None:
            _clean_after_process_0(group, staging, token, dst)
        raise (err if isinstance(err, MaxckptError) else ConversionError(message)) from None
    if verdict != "ok":
        raise PeerFailure(verdict.partition("\n")[2] or "process 0 could not commit the output")
    return len(mine), written


def _clean_after_process_0(group: Group, staging: str, token: str | None, dst: Path | str) -> None:
    """When process 0 died, the lowest surviving process removes what it left: nothing of DST stays behind.

    Process 0 owns the staging folder (or the bucket's `writing` record) and
    would remove it on failure; dead, it cannot. Its death is what the
    coordination service (in a child that outlives it) shows: its heartbeat
    stopped. The others are given time to stop writing first; if one may
    still be writing (hung), the output stays for the next conversion to
    DST to remove, as a dead owner's always does.
    """
    from maxckpt.conversion.staging import remove_abandoned
    from maxckpt.storage import outputs
    from maxckpt.storage.urls import is_url

    with contextlib.suppress(Exception):  # best effort: the error the user sees is the conversion's own
        dead = group._dead()
        if 0 not in dead or group.rank != min(set(range(1, group.size)) - dead):
            return
        if group.wait_stopped():
            return
        if is_url(dst):
            if token is not None:
                outputs.abandon_dead_writer(staging, token)
        else:
            remove_abandoned(Path(staging).parent, Path(dst))


@contextlib.contextmanager
def _shared_destination(group: Group, dst: Path | str, overwrite: bool, notes: list[str]) -> Iterator[Path]:
    """Process 0, DST on a shared filesystem: the staging folder every process writes into, renamed to DST on \
success."""
    from maxckpt.conversion.staging import staged_output

    with staged_output(dst, overwrite, notes) as tmp:
        try:
            group.publish("staging", os.fspath(tmp))
            yield tmp
        except BaseException as err:
            if not isinstance(err, PeerFailure):
                group.fail(_message(err))
            group.wait_stopped()  # the others stop writing before staged_output removes the folder
            raise


@contextlib.contextmanager
def _bucket_destination(group: Group, dst: Path | str, overwrite: bool, native: bool) -> Iterator[Any]:
    """Process 0, DST on a bucket: prepare DST (overwrite rules, `writing` record), commit it with the marker on \
success.

    A bucket has no rename: every process writes its share in place (MaxText
    through TensorStore, the others through their own local spool, uploaded),
    and nothing a process needs from another comes from that process's disk.
    On failure the output is removed once the others stopped writing; when
    one may still be writing (hung), it stays partial output (the `writing`
    record, no `complete` marker), which readers refuse and the next
    conversion to DST removes.
    """
    from maxckpt.storage import outputs

    url = outputs.begin(dst, overwrite)
    try:
        with outputs.spooled(url, native=native) as tmp:
            group.publish("staging", url)
            yield tmp
        outputs.commit(url)
    except BaseException as err:
        if not isinstance(err, PeerFailure):
            group.fail(_message(err))
        if not group.wait_stopped():
            outputs.abandon(url, native=native)
        raise


def _message(err: BaseException) -> str:
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(err, SystemExit):
        return "stopped by a signal"
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__



def run(request: DistributedRequest, body: Callable[[Group], Any]) -> Any:
    """Join the other processes, run `body(group)`, and leave; a failure here is posted for the others first."""
    group = Group.join(request)
    try:
        return body(group)
    except BaseException as err:
        if not isinstance(err, PeerFailure) and not group._failed_here:
            group.fail(_message(err))
        raise
    finally:
        if group.rank != 0:
            with contextlib.suppress(Exception):
                group.publish(f"stopped/{group.rank}", "1")  # process 0 may stop the service once this one left
        group.leave()
