"""Retry transient object-store errors with backoff; turn permanent ones into one clear error.

Buckets answer "slow down" (HTTP 429), "try again" (5xx) and drop
connections as a matter of course; a checkpoint job must ride those out and
only fail on what retrying cannot fix (no such bucket, no permission). The
fsspec clients (gcsfs, s3fs) already retry some calls; this wraps the calls
maxckpt makes itself, so every operation gets the same policy, and gives up
after `attempts` with a :class:`~maxckpt.errors.StorageError` naming the
operation, the path and the last error.

Every wait on a store is bounded, and the bounds are set here, explicitly,
for every client maxckpt and Orbax use (environment variables override them):

- ``MAXCKPT_STORAGE_TIMEOUT`` (default 60 s): connect and read timeout of one
  request (botocore for s3fs, aiohttp for gcsfs).
- ``MAXCKPT_STORAGE_RETRIES`` (default 4): retries of one request inside the
  clients: botocore (standard mode; s3fs tries each call twice around it, not 5 times) and TensorStore's ``s3``/``gcs``
  drivers (1 s doubling to at most 10 s between tries, about 15 s in all by
  default, instead of TensorStore's 32 retries of up to 32 s), and gcsfs
  (1 s doubling: about 15 s by default; gcsfs alone would take 6 tries, 31 s).
- :func:`with_retries` tries maxckpt's own operations `ATTEMPTS` times, but
  gives up at once when the endpoint cannot be reached at all or no
  credentials are found (the clients already retried; retrying that only
  delays the error).

>>> with_retries(lambda: fs.cat_file("bucket/x"), what="read", path="gs://bucket/x")   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
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
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_RETRIES = 4


def _env_number(name: str, default: float, kind: type = float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise StorageError(
            f"{name}={raw!r}: expected a number ({'whole ' if kind is int else ''}seconds or count)"
        ) from None
    if value < 0 or (kind is float and value == 0):
        raise StorageError(f"{name}={raw!r}: expected a positive number")
    return value


def request_timeout() -> float:
    """Seconds one request may take to connect, and between bytes read (``MAXCKPT_STORAGE_TIMEOUT``, default 60)."""
    return float(_env_number("MAXCKPT_STORAGE_TIMEOUT", DEFAULT_TIMEOUT_S))


def request_retries() -> int:
    """Retries of one request inside the clients (``MAXCKPT_STORAGE_RETRIES``, default 4)."""
    return int(_env_number("MAXCKPT_STORAGE_RETRIES", DEFAULT_RETRIES, int))


def fsspec_options(protocol: str) -> dict:
    """The timeouts and retries maxckpt gives every s3fs / gcsfs instance (also epath's, Orbax's small files)."""
    timeout, retries = request_timeout(), request_retries()
    if protocol == "s3":
        return {
            "config_kwargs": {
                "connect_timeout": timeout,
                "read_timeout": timeout,
                "retries": {"max_attempts": retries + 1, "mode": "standard"},
            },
        }
    import aiohttp

    # gcsfs: aiohttp's timeouts of each request (connect, and between bytes; no total: large uploads take long)
    return {"requests_timeout": aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)}


def tensorstore_retries(driver: str) -> dict:
    """The retry policy of TensorStore's ``s3``/``gcs`` kvstore, inlined in its spec (a context resource)."""
    return {
        f"{driver}_request_retries": {
            "max_retries": max(1, request_retries()),
            "initial_delay": "1s",
            "max_delay": "10s",
        }
    }


def configure_fsspec(scheme: str = "") -> None:
    """Make :func:`fsspec_options` fsspec's defaults, so every filesystem built without them (epath's) gets them too.

    fsspec caches instances by their arguments: changed settings give new instances.
    `scheme` ("gs", "s3") also bounds that client's own retry loop (imported only then).
    """
    from fsspec.config import conf

    conf["s3"] = {**conf.get("s3", {}), **fsspec_options("s3")}
    for protocol in ("gcs", "gs"):
        conf[protocol] = {**conf.get(protocol, {}), **fsspec_options("gcs")}
    if scheme == "gs":
        _bound_gcsfs_retries(request_retries() + 1)
    elif scheme == "s3":
        _bound_s3fs_retries()


def _bound_s3fs_retries() -> None:
    """s3fs tries each call 5 times around botocore's own retries (25 attempts): once more at most here."""
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.retries = S3FS_TRIES


S3FS_TRIES = 2


def _bound_gcsfs_retries(attempts: int) -> None:
    """gcsfs fixes its tries per request (6, about 31 s of backoff) when its class is defined: re-wrap them."""
    try:
        import gcsfs.core
        import gcsfs.retry
    except ImportError:
        return
    cls = gcsfs.core.GCSFileSystem
    current = cls.__dict__.get("_request")
    if current is None or getattr(current, "_maxckpt_attempts", None) == attempts:
        return
    original = getattr(current, "_maxckpt_original", None) or getattr(current, "__wrapped__", None)
    if original is None:  # gcsfs changed: keep its own policy
        return
    patched = gcsfs.retry.retry_request(retries=max(1, attempts))(original)
    patched._maxckpt_original, patched._maxckpt_attempts = original, attempts
    cls._request = patched


class _OneLine(logging.Filter):
    """gcsfs logs a full traceback when a request runs out of tries; the error itself reaches the caller."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "out of retries" in record.getMessage() or "non-retriable" in record.getMessage():
            return False  # the error itself reaches the caller (with_retries, the CLI's error line)
        record.exc_info = record.exc_text = None
        return True


logging.getLogger("gcsfs").addFilter(_OneLine())


_UNREACHABLE = ("EndpointConnectionError", "ClientConnectorError", "ConnectionRefusedError", "ClientConnectorDNSError",
                "ConnectTimeoutError", "ServerTimeoutError")
_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError", "RefreshError",
                   "CredentialRetrievalError")


def _scheme_of(err: BaseException) -> str:
    module = type(err).__module__
    if module.startswith(("botocore", "aiobotocore", "s3fs")):
        return "s3"
    if module.startswith(("google", "gcsfs", "aiohttp")):
        return "gs"
    return ""


def permanent_error(err: BaseException, what: str, path: str) -> StorageError | None:
    """The one-line error for what no retry fixes: an unreachable endpoint, missing credentials; else None."""
    name = type(err).__name__
    chain = [err, err.__cause__, err.__context__]
    names = {type(e).__name__ for e in chain if e is not None}
    scheme = path.split("://", 1)[0] if "://" in path else _scheme_of(err)
    what = f"{what} {path}".strip()
    if names & set(_NO_CREDENTIALS):
        how = {
            "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials",
            "gs": "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS",
        }.get(scheme, "configure the store's credentials")
        return StorageError(f"{what} failed: no credentials found ({name}: {_first_line(err)}): {how}")
    if names & set(_UNREACHABLE) or isinstance(err, ConnectionRefusedError):
        where = {
            "s3": "check the network, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 and AWS_REGION",
            "gs": "check the network (and STORAGE_EMULATOR_HOST, if set)",
        }.get(scheme, "check the network")
        return StorageError(
            f"{what} failed: cannot reach the store's endpoint after the client's retries "
            f"({name}: {_first_line(err)}): {where}"
        )
    return None


def client_error(err: BaseException) -> StorageError | None:
    """A storage client's own error that reached the top raw (an epath, fsspec or TensorStore call made outside
    :func:`with_retries`), as the one-line StorageError it stands for; None when it is not one.

    The CLI prints it as its `error:` line (:func:`maxckpt.cli.main.main`).
    """
    seen, e = 0, err
    while e is not None and seen < 6:
        permanent = permanent_error(e, "a storage request", "")
        if permanent is not None:
            return permanent
        text = str(e)
        if isinstance(e, ValueError) and "bucket name" in text.lower() and "invalid" in text.lower():
            return StorageError(f"{_first_line(e)}: check the bucket name in the URL")
        if "retry attempts failed" in text and ("CURL error" in text or "DEADLINE" in text or "UNAVAILABLE" in text):
            return StorageError(  # TensorStore, after its (bounded) retries
                f"a storage request failed after {request_retries()} retries (MAXCKPT_STORAGE_RETRIES): "
                f"{_first_line(e)}; check the network and the endpoint"
            )
        if type(e).__name__ in ("FSTimeoutError", "ReadTimeoutError", "ServerTimeoutError") or (
            isinstance(e, TimeoutError) and _scheme_of(e)
        ):
            return StorageError(
                f"a storage request timed out ({type(e).__name__}: {_first_line(e)}); check the network and the "
                f"endpoint, or raise MAXCKPT_STORAGE_TIMEOUT (now {request_timeout():g} s)"
            )
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return line if len(line) <= 300 else line[:300] + " ..."


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
            permanent = permanent_error(err, what, path)
            if permanent is not None:
                raise permanent from err
            if not is_transient(err):
                raise StorageError(f"{what} {path} failed: {type(err).__name__}: {err}") from err
            if attempt == attempts:
                raise StorageError(
                    f"{what} {path} failed {attempts} times with transient errors (last: {type(err).__name__}: "
                    f"{err}); the store may be overloaded or unreachable: try again later"
                ) from err
            logger.info(
                "maxckpt: %s %s: transient %s (%s); retry %d in %.1fs",
                what,
                path,
                type(err).__name__,
                err,
                attempt,
                delay,
            )
            sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, MAX_DELAY_S)
    raise AssertionError("unreachable")
