"""Parallel reads for a conversion: several tensors (or layer pieces) computed at once, handed out in order.

Why: one tensor at a time leaves the disk and the cores idle - a TensorStore
read of one array decodes its chunks on a couple of threads, and nothing is
written meanwhile. Here up to `workers` threads read and compute the next
units (a whole tensor, or one piece of a stacked one) while the consumer
writes the current one, bounded by a byte budget so memory stays near the
units in flight. The consumer (the pipeline's writer loop) gets results in
the original order, so the output is byte-for-byte what a serial run writes.

The budget is twice the largest unit plus :data:`SLACK` (two of the
largest in flight, one read while one is written, and room for small ones
beside them), capped at the conversion's read budget (``--read-budget``) and
at :data:`DEFAULT_INFLIGHT`, and never below the largest unit: that one
always fits (a single huge tensor still converts), smaller ones overlap.
Sized so, peak memory is about the units in flight plus the imports, not a
fixed 256 MB of read-ahead on top of a model whose tensors are small. Readers' own caches (a group of
stacked layers, see :class:`maxckpt.layouts.transforms.LayerGroups`) are
bounded by the read budget separately.

>>> list(run_ordered([(8, lambda: "a"), (8, lambda: "b")], workers=2, budget=16))
['a', 'b']
>>> validate_workers(0)  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
ConversionError: workers must be a whole number >= 1, got 0
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterable, Iterator

from maxckpt.errors import ConversionError

DEFAULT_INFLIGHT = 256 << 20  # at most this many bytes of units in flight by default (at least the largest unit)
SLACK = 32 << 20  # in flight beyond two of the largest units, so small ones overlap too
MAX_QUEUED = 64  # units started or queued at once; the byte budget usually binds first
MAX_WORKERS = 256

Unit = tuple[int, Callable[[], Any]]  # (bytes it produces, the function that produces it)


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def validate_workers(workers: Any) -> int:
    """`workers` as an int in [1, MAX_WORKERS]; None means :func:`default_workers`.

    A bad value is the user's mistake, so it is a ConversionError saying what is accepted.
    """
    if workers is None:
        return default_workers()
    if isinstance(workers, bool) or not isinstance(workers, int):
        try:
            as_int = int(str(workers).strip())
        except ValueError:
            raise ConversionError(f"workers must be a whole number >= 1, got {workers!r}") from None
        workers = as_int
    if workers < 1 or workers > MAX_WORKERS:
        raise ConversionError(f"workers must be a whole number >= 1, got {workers}" + (
            f" (at most {MAX_WORKERS})" if workers > MAX_WORKERS else ""))
    return workers


def inflight_budget(read_budget: int | None, largest: int) -> int:
    """Bytes of units in flight: 2 x `largest` + SLACK, capped by the read budget and DEFAULT_INFLIGHT, >= `largest`.

    >>> inflight_budget(None, 100 << 20) >> 20, inflight_budget(None, 1 << 20) >> 20, \
inflight_budget(64 << 20, 1 << 30) >> 20
    (232, 34, 1024)
    """
    cap = DEFAULT_INFLIGHT if read_budget is None else min(int(read_budget), DEFAULT_INFLIGHT)
    return max(int(largest), min(cap, 2 * int(largest) + SLACK), 1)


def run_ordered(
    units: Iterable[Unit], *, workers: int, budget: int, outstanding: Callable[[], int] | None = None
) -> Iterator[Any]:
    """Run `units` on `workers` threads, yielding their results in the order given.

    A unit starts only while the bytes of started-but-not-consumed units
    (including the one the consumer holds), plus `outstanding()` - what the
    consumer still holds of units it was handed earlier, such as writes a
    writer has queued - stay within `budget`; one unit always runs, whatever
    its size. A failed unit raises its exception here,
    in the consumer, when its turn comes. When the consumer stops early (an
    error, Ctrl-C, `close()`), queued units are cancelled and running ones
    are waited for, so no read is still touching a reader (or the
    temporary output) once this generator is closed.
    """
    units = iter(units)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="maxckpt-read")
    pending: deque[tuple[int, Future]] = deque()
    held = 0  # bytes of units submitted and not yet handed back to the producer by the consumer
    lookahead: Unit | None = None
    exhausted = False

    def fill() -> None:
        nonlocal held, lookahead, exhausted
        while not exhausted and len(pending) < max(MAX_QUEUED, 2 * workers + 1):
            if lookahead is None:
                lookahead = next(units, None)
                if lookahead is None:
                    exhausted = True
                    return
            nbytes, fn = lookahead
            if (pending or held) and held + nbytes + (outstanding() if outstanding else 0) > budget:
                return
            pending.append((nbytes, pool.submit(fn)))
            held += nbytes
            lookahead = None

    try:
        fill()
        while pending:
            nbytes, future = pending.popleft()
            result = future.result()
            fill()  # the consumer's unit still counts: reads continue while it is written
            yield result
            del result
            held -= nbytes
            fill()
    finally:
        for _, future in pending:
            future.cancel()
        wait([f for _, f in pending])
        pool.shutdown(wait=True, cancel_futures=True)
