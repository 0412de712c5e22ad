"""Parse what a user hands us (JSON, YAML, pickles) with bounds on size and nesting depth.

Deeply nested input is the cheapest way to crash a Python program: the
JSON and YAML parsers raise RecursionError, and a pickle of nested tuples
used as a dict key makes CPython's tuple hash recurse in C until the
process segfaults, whatever unpickler is used. So before anything is
parsed, its nesting is measured without recursion and refused past
:data:`MAX_DEPTH` levels; real checkpoint metadata and configs nest a
dozen levels at most.

Every function raises ``BoundsError`` (a ValueError) with a short reason
that never quotes the input; callers wrap it in the project's error for
the file at hand.

>>> loads_json('{"a": [1, 2]}')
{'a': [1, 2]}
>>> loads_json("[" * 1000 + "]" * 1000)  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
BoundsError: nested 1000 levels deep; the limit is 64
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickletools
import re
import stat
from pathlib import Path
from typing import IO, Any

import numpy as np

MAX_DEPTH = 64  # JSON / YAML nesting
MAX_PICKLE_DEPTH = 100  # objects inside objects in a pickle
MAX_JSON_BYTES = 256 * 1024 * 1024  # a sidecar JSON (config.json, index, _METADATA) larger than this is not one


class BoundsError(ValueError):
    """Input past a size or depth bound, or not parseable; the message never quotes the input."""


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DEPTH_BLOCK = 1 << 20


def json_depth(raw: bytes) -> int:
    """How deeply `raw` JSON nests (objects and arrays), counted without recursion or parsing."""
    codes = np.frombuffer(_JSON_STRING.sub(b"", raw), dtype=np.uint8)
    deepest, level = 0, 0
    for start in range(0, codes.size, _DEPTH_BLOCK):  # in blocks: a 100 MB header needs no GB of scratch
        block = codes[start : start + _DEPTH_BLOCK]
        step = ((block == ord("[")) | (block == ord("{"))).astype(np.int32) - (
            (block == ord("]")) | (block == ord("}"))
        )
        levels = np.cumsum(step, dtype=np.int64) + level
        deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def loads_json(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` with the nesting bounded first; BoundsError on anything that is not JSON."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    depth = json_depth(data)
    if depth > max_depth:
        raise BoundsError(f"nested {depth} levels deep; the limit is {max_depth}")
    try:
        return json.loads(data)
    except RecursionError:  # cannot happen after the depth check; kept as a last line of defence
        raise BoundsError(f"nested too deeply (over {max_depth} levels)") from None
    except UnicodeDecodeError as err:
        raise BoundsError(f"not UTF-8 text (byte {err.start})") from None
    except ValueError as err:
        msg = getattr(err, "msg", None)
        where = f" at line {err.lineno}, column {err.colno}" if hasattr(err, "lineno") else ""
        raise BoundsError(f"not valid JSON ({msg or 'malformed'}{where})") from None


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(path: str | os.PathLike) -> str | None:
    """What a local path is when it is there but no regular file ("a FIFO (named pipe)", "a character device", ...).

    None for a regular file, a missing path and a bucket URL. Why: "does not
    exist" or "truncated" for /dev/zero or a FIFO sends a user looking for
    the wrong problem.
    """
    from maxckpt.storage.urls import is_url

    if is_url(path):
        return None
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def open_regular(path: str | Path) -> IO[bytes]:
    """Open a regular file for reading; a FIFO, socket or device is an OSError instead of a hang.

    Opening a FIFO for reading blocks until a writer appears, so the file is
    opened non-blocking, checked, and only then switched back to blocking.
    """
    from maxckpt.storage.urls import as_path, is_url

    if is_url(path):  # an object in a bucket: no FIFOs or devices there
        return as_path(path).open("rb")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file (a pipe, socket or device)", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json(path: str | Path, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON file, bounded in size and depth. OSError passes through; BoundsError for bad content."""
    from maxckpt.storage.urls import as_path

    path = as_path(path)
    if path.is_dir():
        raise BoundsError("is a directory, not a JSON file")
    with open_regular(path) as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise BoundsError(f"larger than {max_bytes} bytes, the limit for a metadata file")
    return loads_json(raw, max_depth=max_depth)


def read_json_object(path: str | Path, **bounds: Any) -> dict:
    """:func:`read_json`, requiring a JSON object at the top."""
    value = read_json(path, **bounds)
    if not isinstance(value, dict):
        raise BoundsError(f"holds a JSON {_json_kind(value)}, not an object")
    return value


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def check_depth(value: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = 5_000_000) -> None:
    """Refuse a parsed value (dicts, lists, tuples) nested past `max_depth` or holding more than `max_nodes` items.

    Walks iteratively, counting shared references each time they are
    reached, so YAML alias bombs (one list referenced a billion times) are
    refused before anything copies them.
    """
    stack = [(value, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise BoundsError(f"holds more than {max_nodes} values (a YAML alias bomb?)")
        if isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = list(item)
        else:
            continue
        if depth > max_depth:
            raise BoundsError(f"nested more than {max_depth} levels deep; the limit is {max_depth}")
        stack.extend((c, depth + 1) for c in children)


MAX_YAML_ALIAS_NODES = 100_000  # values YAML aliases may add to a document; a real config's anchors add a few hundred


def yaml_alias_nodes(root: Any, *, limit: int = MAX_YAML_ALIAS_NODES) -> int:
    """How many nodes `root`'s aliases add when the document is expanded (0 for plain YAML), counted without recursion.

    Why: the billion-laughs bound must grow with the aliases only, never with
    the document's size. Counts saturate just past `limit` (a bomb is
    measured, never expanded). A node that contains itself (a recursive
    alias) is a BoundsError.
    """
    import yaml

    def children(node: Any) -> list:
        if isinstance(node, yaml.SequenceNode):
            return list(node.value)
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return []

    order: list = []  # every distinct node once, after the nodes below it
    finished: dict[int, bool] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            finished[id(node)] = True
            order.append(node)
        elif id(node) not in finished:
            finished[id(node)] = False
            stack.append((node, True))
            stack.extend((c, False) for c in children(node))
        elif not finished[id(node)]:
            raise BoundsError("a YAML alias refers to a node that contains it (a recursive alias)")
    cap = limit + len(order) + 1
    expanded: dict[int, int] = {}
    for node in order:
        expanded[id(node)] = min(cap, 1 + sum(expanded[id(c)] for c in children(node)))
    return expanded[id(root)] - len(order)


# ---------------------------------------------------------------- pickles

# Opcodes that pop the items down to the last MARK and push one object built from them.
_FROM_MARK = {"TUPLE", "LIST", "DICT", "FROZENSET", "INST", "OBJ"}
# Opcodes that pop the items down to the last MARK into the object below them.
_INTO_FROM_MARK = {"APPENDS", "SETITEMS", "ADDITEMS"}
_EMPTY = {"EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"}


class _Cell:
    """One object on the simulated unpickler stack: only its nesting depth matters."""

    __slots__ = ("depth",)

    def __init__(self, depth: int):
        self.depth = depth


def scan_pickle(stream: IO[bytes], *, max_depth: int = MAX_PICKLE_DEPTH) -> None:
    """Walk one pickle's opcodes (to its STOP) tracking how deeply the objects it builds nest.

    Nothing is built and no class is looked up, so a hostile pickle cannot
    crash or run anything here; one nesting past `max_depth` raises
    BoundsError before a real unpickler sees it. The stream is left after STOP.
    """
    stack: list[Any] = []  # _Cell or the MARK sentinel
    memo: dict[Any, _Cell] = {}
    mark = object()
    next_memo = 0

    def pop_to_mark() -> list[_Cell]:
        items = []
        while stack:
            top = stack.pop()
            if top is mark:
                return items
            items.append(top)
        raise BoundsError("malformed pickle (no MARK)")

    def pop(n: int = 1) -> list[_Cell]:
        if len(stack) < n or any(c is mark for c in stack[len(stack) - n :]):
            raise BoundsError("malformed pickle (stack underflow)")
        items = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return items

    def push_over(items: list[_Cell]) -> None:
        depth = 1 + max((c.depth for c in items), default=0)
        if depth > max_depth:
            raise BoundsError(f"objects nested more than {max_depth} levels deep; the limit is {max_depth}")
        stack.append(_Cell(depth))

    def merge_into(target: _Cell, items: list[_Cell]) -> None:
        depth = max(target.depth, 1 + max((c.depth for c in items), default=0))
        if depth > max_depth:
            raise BoundsError(f"objects nested more than {max_depth} levels deep; the limit is {max_depth}")
        target.depth = depth

    try:
        for op, arg, _ in pickletools.genops(stream):
            name = op.name
            if name == "STOP":
                return
            if name == "MARK":
                stack.append(mark)
            elif name in _EMPTY:
                stack.append(_Cell(1))
            elif name in _FROM_MARK:
                push_over(pop_to_mark())  # INST/OBJ: the built object holds its class and args
            elif name in _INTO_FROM_MARK:
                items = pop_to_mark()
                if not stack or stack[-1] is mark:
                    raise BoundsError(f"malformed pickle ({name} with no container)")
                merge_into(stack[-1], items)
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                push_over(pop(int(name[-1])))
            elif name in ("APPEND",):
                item, = pop()
                target = stack[-1] if stack and stack[-1] is not mark else None
                if target is None:
                    raise BoundsError("malformed pickle (APPEND with no list)")
                merge_into(target, [item])
            elif name == "SETITEM":
                key, value = pop(2)
                target = stack[-1] if stack and stack[-1] is not mark else None
                if target is None:
                    raise BoundsError("malformed pickle (SETITEM with no dict)")
                merge_into(target, [key, value])
            elif name == "BUILD":
                state, = pop()
                target = stack[-1] if stack and stack[-1] is not mark else None
                if target is None:
                    raise BoundsError("malformed pickle (BUILD with no object)")
                merge_into(target, [state])
            elif name in ("REDUCE", "NEWOBJ"):
                push_over(pop(2))
            elif name == "NEWOBJ_EX":
                push_over(pop(3))
            elif name in ("POP",):
                pop()
            elif name == "POP_MARK":
                pop_to_mark()
            elif name == "DUP":
                stack.append(pop()[0])
                stack.append(stack[-1])
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                if not stack or stack[-1] is mark:
                    raise BoundsError("malformed pickle (PUT with an empty stack)")
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                if not stack or stack[-1] is mark:
                    raise BoundsError("malformed pickle (MEMOIZE with an empty stack)")
                memo[next_memo] = stack[-1]
                next_memo += 1
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                cell = memo.get(arg)
                if cell is None:
                    raise BoundsError("malformed pickle (memo entry read before it was written)")
                stack.append(cell)
            elif name == "BINPERSID":
                pop()
                stack.append(_Cell(0))
            elif name in ("PROTO", "FRAME"):
                pass
            elif name in ("GLOBAL",):
                stack.append(_Cell(0))
            elif name == "STACK_GLOBAL":
                pop(2)
                stack.append(_Cell(0))
            else:
                # Every other opcode pushes one plain value (ints, strings, bytes, None, bools, floats, ext codes).
                stack.append(_Cell(0))
    except BoundsError:
        raise
    except (
        ValueError,
        EOFError,
        IndexError,
        KeyError,
        TypeError,
        UnicodeDecodeError,
        OverflowError,
        MemoryError,
    ) as err:
        raise BoundsError(f"malformed pickle ({type(err).__name__})") from None
    raise BoundsError("malformed pickle (no STOP opcode)")


def check_pickle_bytes(data: bytes, *, max_depth: int = MAX_PICKLE_DEPTH) -> None:
    """:func:`scan_pickle` over a pickle held in memory."""
    scan_pickle(io.BytesIO(data), max_depth=max_depth)


def check_torch_file(file: str | Path | IO[bytes], *, max_depth: int = MAX_PICKLE_DEPTH) -> None:
    """Scan the pickle(s) of a `torch.save` file (zip or legacy format) before torch.load sees it."""
    import zipfile

    opened = open_regular(file) if isinstance(file, (str, Path)) else None
    stream = opened or file
    try:
        start = stream.tell()
        if zipfile.is_zipfile(stream):
            stream.seek(start)
            try:
                with zipfile.ZipFile(stream) as archive:
                    pickles = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
                    if not pickles:
                        raise BoundsError("not a torch.save archive (no data.pkl)")
                    for name in pickles:
                        with archive.open(name) as member:
                            scan_pickle(io.BufferedReader(member), max_depth=max_depth)  # type: ignore[arg-type]
            except BoundsError:
                raise
            except Exception as err:  # zipfile/zlib on damaged bytes; nothing from the file runs here
                raise BoundsError(f"not a readable torch.save archive ({type(err).__name__})") from None
        else:
            # Legacy format: magic number, protocol, sys info, the object, the storage keys - five pickles.
            stream.seek(start)
            for _ in range(5):
                scan_pickle(stream, max_depth=max_depth)
        stream.seek(start)
    finally:
        if opened is not None:
            opened.close()
