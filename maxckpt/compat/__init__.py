"""Every patch maxckpt makes to a dependency, in one package, behind one version gate.

Each module below reaches into one dependency's internals for one reason, and asks
:func:`~maxckpt.compat.versions.written_for` first, which compares the installed release with the
range the patches were written for (:data:`~maxckpt.compat.versions.WRITTEN_FOR`, the same ranges as
``pyproject.toml``) once per package. Policy outside that range: it is logged once; an optimisation
stands aside (restores work as Orbax's own); a patch a feature needs still checks the exact code it
relies on and raises a clear error if that changed (as it does on the pinned releases).

=================== ================================== ============================ ================= ==================
module              what is patched                    why                          upstream issue    when it can go
=================== ================================== ============================ ================= ==================
orbax_s3 (Orbax     tensorstore_utils._normalize_path, Orbax builds TensorStore     google/orbax#359, Orbax maps s3://
0.12)               _use_gcs_driver,                   specs for gs:// only: s3://  google/orbax#872, to TensorStore's
                    gcs_utils.get_kvstore_for_gcs      arrays would land in a local PR #2739 (open)   s3 driver
                                                       s3:/ folder

orbax_mapped_reads  tensorstore_utils.get_ts_context,  restores copy each byte      none filed        a restore can pass
(Orbax 0.12)        while a manager restore runs       twice (pread into fresh                        Orbax its
                                                       buffers); mmap copies once                     TensorStore
                                                                                                      context

orbax_aligned_reads serialization._read_shard, while a numpy's buffers are not      none filed        Orbax allocates
(Orbax 0.12)        manager restore runs               64-byte aligned: JAX's CPU                     aligned host
                                                       client copies each array                       buffers
                                                       again

orbax_threads       future._SignalingThread writers of a failed async save leaves   none filed        a failed save ends
(Orbax 0.12)        a failed save (cancelled, woken);  non-daemon writers waiting                     its other writers
                    absl log filter                    300 s each, joined at exit

maxtext (MaxText    maxtext.common.checkpointing:      maxckpt's manager inside     none filed        MaxText's trainer
0.2.5)              create_orbax_checkpoint_manager,   MaxText's own trainer (the                     takes a manager
                    maybe_save_checkpoint              feature:                                       factory
                                                       maxckpt.maxtext.patch)

jax_distributed     jax._src.distributed:              a failed join aborts the     none filed        initialize raises
(JAX >= 0.6)        get_distributed_runtime_client     process (SIGABRT); no public                   on a failed join;
                    during initialize; global_state    key-value client                               JAX exposes its
                                                                                                      client

jax_service         jax._src.distributed:              process 0's death kills the  none filed        a peer's client
(JAX >= 0.6)        _jax.get_distributed_runtime_      service inside it, and JAX                     survives the
                    service during initialize (run     aborts every other process                     service's loss
                    in a child of process 0)           (std::bad_cast, SIGABRT)                       (raises instead)
=================== ================================== ============================ ================= ==================

Not a patch, but a version difference asked for where it exists: ``tensorstore`` (TensorStore's ``memmap``
file I/O mode). Patches other than of these dependencies: ``maxckpt.storage.retry`` bounds gcsfs's and s3fs's
own retry loops (fsspec clients, part of the storage seam).
"""
