"""Retry transient object-store errors with backoff; turn permanent ones into one clear error.

Buckets answer "slow down" (HTTP 429), "try again" (5xx) and drop
connections as a matter of course; a checkpoint job must ride those out and
only fail on what retrying cannot fix (no such bucket, no permission). The
fsspec clients (gcsfs, s3fs) already retry some calls; this wraps the calls
maxckpt makes itself, so every operation gets the same policy, and gives up
after `attempts` with a :class:`~maxckpt.errors.StorageError` naming the
operation, the path and the last error.

>>> with_retries(lambda: fs.cat_file("bucket/x"), what="read", path="gs://bucket/x")   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

from maxckpt.errors import StorageError

logger = logging.getLogger("maxckpt.storage")

T = TypeVar("T")

ATTEMPTS = 6
BASE_DELAY_S = 0.2
MAX_DELAY_S = 10.0
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def _status(err: BaseException) -> int | None:
    """The HTTP status an fsspec/botocore/gcsfs error carries, if any."""
    for attr in ("code", "status", "status_code"):
        value = getattr(err, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(err, "response", None)  # botocore ClientError
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata") or {}
        status = meta.get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    return None


def is_transient(err: BaseException) -> bool:
    """True for errors worth retrying: HTTP 408/429/5xx, timeouts, dropped connections."""
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)):
        return False
    if isinstance(err, (TimeoutError, ConnectionError)):
        return True
    status = _status(err)
    if status is not None:
        return status in _TRANSIENT_STATUS
    name = type(err).__name__
    if name in ("ServerDisconnectedError", "ClientConnectorError", "ClientOSError", "ReadTimeoutError",
                "ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError", "RetryError"):
        return True
    text = str(err)
    return any(marker in text for marker in ("429", "503", "500 Internal", "502", "504", "SlowDown", "Timeout"))


def with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    path: str,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`fn()`, retried on transient errors with exponential backoff and jitter.

    A FileNotFoundError passes through unchanged (callers decide what a
    missing object means); any other permanent error, or a transient one that
    outlasts `attempts`, raises StorageError.
    """
    delay = BASE_DELAY_S
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except FileNotFoundError:
            raise
        except StorageError:
            raise
        except Exception as err:  # noqa: BLE001 - classified right here
            if not is_transient(err):
                raise StorageError(f"{what} {path} failed: {type(err).__name__}: {err}") from err
            if attempt == attempts:
                raise StorageError(
                    f"{what} {path} failed {attempts} times with transient errors (last: {type(err).__name__}: "
                    f"{err}); the store may be overloaded or unreachable: try again later"
                ) from err
            logger.info("maxckpt: %s %s: transient %s (%s); retry %d in %.1fs", what, path, type(err).__name__, err, attempt, delay)
            sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, MAX_DELAY_S)
    raise AssertionError("unreachable")
