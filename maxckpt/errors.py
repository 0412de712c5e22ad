"""The one exception hierarchy for problems a user can cause.

Everything a user can get wrong (a bad path, a corrupt file, a config typo,
mismatched shapes, an unknown model family) raises a subclass of
:class:`MaxckptError`. The CLI prints such an error as one readable message and
exits non-zero; any other exception is a bug in maxckpt and keeps its
traceback. Messages say what was wrong, where, and what to do next.
"""

from __future__ import annotations


class MaxckptError(Exception):
    """Base class: a problem the user can fix. The message is shown as is."""

    exit_code: int = 1


class ConfigError(MaxckptError):
    """A config file or override is invalid (unknown key, wrong type, broken rule)."""

    exit_code = 2


class CheckpointNotFoundError(MaxckptError):
    """A path holds no checkpoint (or no committed step) where one was expected."""


class TensorNotFoundError(CheckpointNotFoundError, KeyError):
    """A checkpoint has no tensor of the asked name.

    Also a KeyError, so code that looks tensors up like dict keys keeps working.
    """

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class CorruptCheckpointError(MaxckptError):
    """A checkpoint exists but its files are truncated, malformed or hostile."""


class ShapeMismatchError(MaxckptError):
    """A tensor's shape or dtype differs from what the layout or target expects."""


class UnsupportedModelError(MaxckptError):
    """The model family, tensor layout or format pair is not supported."""


class ConversionError(MaxckptError):
    """A conversion or verification could not be completed as asked."""


class CheckpointSaveError(MaxckptError):
    """A checkpoint could not be written: the directory is unwritable, the disk is full, an async save failed.

    Checkpoints committed before the failure are untouched.
    """


class RunDirBusyError(MaxckptError):
    """Another process holds the run directory's lock (it is saving there): two writers would destroy each other's \
saves."""
class StorageError(MaxckptError, OSError):
    """An object-store operation failed for good (after retries, or a permanent error).

    Also an OSError, so code that handles file-system errors (retention's
    "warn and retry on the next pass") treats a bucket the same way.
    """
