"""Knobs: options-dataclass fields that carry their CLI flag, help and checks, so each is declared once.

A target format's options class (`MegatronOptions`, `HFOptions`, ...) lists its knobs with :func:`knob`;
`maxckpt convert` builds its flags from that metadata and the class checks the values it is given, for
the CLI and the Python API alike. A knob without flags is an API-only setting.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True, kw_only=True)
... class Example(Knobs):
...     level: int = knob(1, "--level", type=int, help="How much.", minimum=0)
>>> Example(level=-1)  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
ConversionError: level must be >= 0, got -1
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Sequence

from maxckpt.errors import ConversionError

_KEY = "maxckpt_knob"
FIELD_DEFAULT: Any = object()  # a Knob.cli_default meaning "the field's default"


@dataclasses.dataclass(frozen=True)
class Knob:
    """What one field says about itself: its flags (none: API only), their help, and the checks of its value."""

    flags: tuple[str, ...]
    type: Any  # the annotation the CLI parameter gets (what typer parses the flag as)
    help: str | None = None
    panel: str | None = None  # the rich help panel (None: Options)
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    parse: Callable[[Any], Any] | None = None  # the value as given (a CLI string, say) -> the field's value
    from_cli: Callable[[Any], Any] | None = None  # the CLI parameter's value -> what the field is given
    refused_elsewhere: str | None = None  # with another target: "--flag VALUE <this>; it cannot be used with --to X"
    cli_default: Any = FIELD_DEFAULT  # the CLI parameter's default when it is not the field's

    @property
    def name(self) -> str:
        """The CLI parameter's name and the label of its messages: `--megatron-spec` -> `megatron_spec`."""
        return self.flags[0].split("/")[0].lstrip("-").replace("-", "_")


def knob(
    default: Any,
    *flags: str,
    type: Any,
    help: str | None = None,
    panel: str | None = None,
    choices: Sequence[str] | None = None,
    minimum: float | None = None,
    parse: Callable[[Any], Any] | None = None,
    from_cli: Callable[[Any], Any] | None = None,
    refused_elsewhere: str | None = None,
    cli_default: Any = FIELD_DEFAULT,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass field with its :class:`Knob`: `spec: str = knob("te", "--megatron-spec", type=str, help=...)`."""
    meta = {_KEY: Knob(tuple(flags), type, help, panel, tuple(choices) if choices else None, minimum, parse, from_cli,
                       refused_elsewhere, cli_default)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def knobs(cls: type) -> Iterator[tuple[dataclasses.Field, Knob]]:
    """The fields of an options class that are knobs, in declaration order."""
    for f in dataclasses.fields(cls):
        if _KEY in f.metadata:
            yield f, f.metadata[_KEY]


def knob_help(cls: type, name: str) -> str:
    """The help text of `cls`'s knob `name`, for a command that shares the flag (verify's --maxtext-config)."""
    return next(k.help for f, k in knobs(cls) if f.name == name)


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (its factory's product for a mutable one)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


class Knobs:
    """Base of the options classes: parses and checks every knob once it is set, whoever set it."""

    def __post_init__(self) -> None:
        for f, k in knobs(type(self)):
            value = getattr(self, f.name)
            if k.parse is not None and value is not None:
                value = k.parse(value)
                object.__setattr__(self, f.name, value)  # frozen: the parsed value replaces the one given
            if k.choices is not None and value is not None and value not in k.choices:
                raise ConversionError(f"{k.name} must be one of {', '.join(k.choices)}, got {value!r}")
            if k.minimum is not None and value is not None and value < k.minimum:
                raise ConversionError(f"{k.name} must be >= {k.minimum:g}, got {value}")

    @classmethod
    def from_cli(cls, values: dict[str, Any]) -> Any:
        """The options the CLI's parameter values (by :attr:`Knob.name`) ask for; missing ones keep their default."""
        given = {}
        for f, k in knobs(cls):
            if k.flags and k.name in values:
                value = values[k.name]
                given[f.name] = k.from_cli(value) if k.from_cli is not None else value
        return cls(**given)
