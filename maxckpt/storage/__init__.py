"""The storage layer: local folders, ``gs://`` and ``s3://`` buckets behind one set of calls.

- :mod:`~maxckpt.storage.urls`: the one URL test and normalisation (:func:`is_url`, :func:`normalize`),
  parsing and joining (:func:`as_path`, :func:`split_url`);
- :mod:`~maxckpt.storage.kvstore`: the TensorStore kvstore spec of a path (``file``, ``gcs``, ``s3``);
- :mod:`~maxckpt.storage.store`: the store protocol, and :func:`store_for`, which picks the local or the bucket store;
- :mod:`~maxckpt.storage.local_store`, :mod:`~maxckpt.storage.bucket_store`: its two implementations;
- :mod:`~maxckpt.storage.objects`: list, read, write, delete, one call each (through the store of the path);
- :mod:`~maxckpt.storage.ownership`: who owns a folder, a bucket output or a lock, and whether it still runs;
- :mod:`~maxckpt.storage.retry`: which errors are transient, and the backoff;
- :mod:`~maxckpt.storage.deletion`: crash-safe deletion on buckets (intent recorded first);
- :mod:`~maxckpt.storage.run_dirs`: which entries of a run directory are checkpoints, committed or not;

Everything above it (containers, layouts, manager, conversion, explore) goes through here.
"""

from maxckpt.storage.kvstore import kvstore_spec
from maxckpt.storage.urls import as_path, is_url, join, normalize, split_url

__all__ = ["as_path", "is_url", "join", "kvstore_spec", "normalize", "split_url"]
