"""The storage layer: local folders, ``gs://`` and ``s3://`` buckets behind one set of calls.

- :mod:`~maxckpt.storage.urls`: parse and join paths and URLs (:func:`as_path`, :func:`split_url`);
- :mod:`~maxckpt.storage.kvstore`: the TensorStore kvstore spec of a path (``file``, ``gcs``, ``s3``);
- :mod:`~maxckpt.storage.objects`: list, read, write, delete objects, with retries;
- :mod:`~maxckpt.storage.retry`: which errors are transient, and the backoff;
- :mod:`~maxckpt.storage.deletion`: crash-safe deletion on buckets (intent recorded first);
- :mod:`~maxckpt.storage.run_dirs`: which entries of a run directory are checkpoints, committed or not;

Everything above it (containers, layouts, manager, conversion, explore) goes through here.
"""

from maxckpt.storage.kvstore import kvstore_spec
from maxckpt.storage.urls import as_path, is_local, is_url, join, split_url

__all__ = ["as_path", "is_local", "is_url", "join", "kvstore_spec", "split_url"]
