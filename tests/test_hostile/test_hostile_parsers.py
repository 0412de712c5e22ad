"""Property-based tests of every parser that reads bytes a user hands us (hypothesis).

For any input: the parser returns the right value, or raises the project's
error for that file (a BoundsError / ValueError inside `maxckpt.storage.bounded`) -
never RecursionError, MemoryError, a segfault or any other exception.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxckpt.storage.bounded import BoundsError, check_pickle_bytes, check_torch_file, json_depth, loads_json
from maxckpt.errors import ConfigError, CorruptCheckpointError, MaxckptError

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=40)


def depth_of(value) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


def nested(levels: int, leaf=None, kind=list):
    value = leaf
    for _ in range(levels):
        value = kind([value]) if kind is not dict else {"k": value}
    return value


# ------------------------------------------------------------------ JSON


@FAST
@given(json_values)
def test_json_within_bounds_parses_exactly(value):
    text = json.dumps(value)
    assert json_depth(text.encode()) == depth_of(value)
    assert loads_json(text) == json.loads(text)


@FAST
@given(st.integers(65, 3000), st.sampled_from([list, dict]))
def test_json_past_the_depth_bound_is_refused(levels, kind):
    with pytest.raises(BoundsError, match="levels deep; the limit is 64"):
        loads_json(json.dumps(nested(levels, 1, kind)) if levels < 900 else "[" * levels + "]" * levels)


@FAST
@given(st.binary(max_size=300))
def test_any_bytes_are_json_or_one_bounds_error(raw):
    try:
        loads_json(raw)
    except BoundsError:
        pass


@FAST
@given(st.text(alphabet='[]{}",:\\ 0a', max_size=400))
def test_bracket_soup_is_json_or_one_bounds_error(text):
    try:
        loads_json(text)
    except BoundsError:
        pass


# --------------------------------------------------------------- pickles

pickle_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10) | st.binary(max_size=10)
pickle_values = st.recursive(
    pickle_scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.lists(inner, max_size=4).map(tuple)
    | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4),
    max_leaves=30,
)


@FAST
@given(pickle_values, st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_plain_pickles_within_bounds_are_accepted(value, protocol):
    check_pickle_bytes(pickle.dumps(value, protocol=protocol))


@FAST
@given(st.integers(101, 400), st.sampled_from([list, tuple, dict]), st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_pickles_past_the_depth_bound_are_refused(levels, kind, protocol):
    with pytest.raises(BoundsError, match="nested more than 100 levels"):
        check_pickle_bytes(pickle.dumps(nested(levels, 0, kind), protocol=protocol))


@FAST
@given(st.binary(max_size=200))
def test_any_bytes_are_a_pickle_or_one_bounds_error(raw):
    try:
        check_pickle_bytes(raw)
    except BoundsError:
        pass


@FAST
@given(st.lists(st.sampled_from([b"N", b"\x85", b"\x86", b"\x87", b"(", b"t", b"]", b"a", b"}", b"s", b"e", b"u", b"0", b"2", b"\x94", b"h\x00", b"q\x00"]), max_size=300))
def test_opcode_soup_is_a_pickle_or_one_bounds_error(ops):
    try:
        check_pickle_bytes(b"\x80\x04" + b"".join(ops) + b".")
    except BoundsError:
        pass


@FAST
@given(st.binary(max_size=200))
def test_any_bytes_as_a_torch_file_are_refused_cleanly(raw):
    try:
        check_torch_file(io.BytesIO(raw))
    except BoundsError:
        pass


# ------------------------------------------------- file parsers, end to end


@FAST
@given(header=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()), claimed=st.integers(0, 2**64 - 1) | st.none(), tail=st.binary(max_size=64))
def test_safetensors_header_parser(tmp_path_factory, header, claimed, tail):
    from maxckpt.containers.safetensors import read_header

    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    n = len(header) if claimed is None else claimed
    path.write_bytes(struct.pack("<Q", n) + header + tail)
    try:
        entries, _ = read_header(path)
    except CorruptCheckpointError:
        return
    for entry in entries.values():  # what it accepts lies inside the file
        assert 8 <= entry.begin <= entry.end <= path.stat().st_size


@FAST
@given(st.binary(max_size=300) | pickle_values.map(pickle.dumps))
def test_dcp_metadata_parser(tmp_path_factory, raw):
    from maxckpt.containers.dcp import load_metadata

    directory = tmp_path_factory.mktemp("dcp")
    (directory / ".metadata").write_bytes(raw)
    with pytest.raises(CorruptCheckpointError):
        load_metadata(directory)  # none of these is DCP metadata


@FAST
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode) | json_values.map(lambda v: json.dumps({"tree_metadata": v}).encode()))
def test_orbax_metadata_parser(tmp_path_factory, raw):
    from maxckpt.containers.orbax import OrbaxReader

    items = tmp_path_factory.mktemp("orbax") / "items"
    items.mkdir()
    (items / "_METADATA").write_bytes(raw)
    try:
        OrbaxReader(items).tensors()
    except MaxckptError:
        pass


@FAST
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_hf_config_parser(tmp_path_factory, raw):
    from maxckpt.formats.hf.files import config_hints

    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_bytes(raw)
    try:
        config_hints(path)
    except MaxckptError:
        pass


yaml_soup = st.lists(st.sampled_from(list("ab: -[]{}&*!|>'\"#\n\t0123.") + ["base_config: ", "save_period: ", "\xff", "\n  "]), max_size=120).map("".join)


@FAST
@given(st.binary(max_size=300) | yaml_soup.map(lambda t: t.encode("utf-8", "surrogateescape")))
def test_yaml_overlay_parser(tmp_path_factory, raw):
    from maxckpt.config import load_config

    path = tmp_path_factory.mktemp("yml") / "overlay.yml"
    path.write_bytes(raw)
    try:
        load_config(path)
    except ConfigError:
        pass


# ----------------------------------------------------- YAML: aliases bounded, not size


def _overlay(tmp_path_factory, text: str) -> Path:
    path = tmp_path_factory.mktemp("yml") / "overlay.yml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("shape", ["6000-keys", "12000-items"])
def test_plain_yaml_with_many_nodes_loads(tmp_path_factory, shape):
    from maxckpt.config import load_config

    # OmegaConf's loader refused any document of over 10,000 nodes as "node expansion".
    if shape == "6000-keys":
        body = "eval_data_columns:\n" + "".join(f"  k{i}: {i}\n" for i in range(6000))
        expected = {f"k{i}": i for i in range(6000)}
    else:
        body = "train_data_columns:\n" + "".join(f"  - c{i}\n" for i in range(12000))
        expected = [f"c{i}" for i in range(12000)]
    cfg = load_config(_overlay(tmp_path_factory, "run_name: r\n" + body))
    assert next(iter(cfg.extra.values())) == expected


def _laughs(levels: int, width: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@FAST
@given(st.integers(1, 5), st.integers(1, 6))
def test_yaml_alias_nodes_counts_what_aliases_add(levels, width):
    import yaml

    from maxckpt.storage.bounded import yaml_alias_nodes

    # Expanded, list l_i holds 1 + width * |l_{i-1}| nodes (|l_0| = 1 + width). Written, the document is the
    # mapping, its keys, l0 with its entries, and one list node per later level (its entries are aliases).
    sizes = [1 + width]
    for _ in range(1, levels):
        sizes.append(1 + width * sizes[-1])
    expanded = 1 + levels + sum(sizes)
    written = 1 + levels + (1 + width) + (levels - 1)
    assert yaml_alias_nodes(yaml.compose(_laughs(levels, width))) == expanded - written


def test_plain_yaml_adds_no_alias_nodes():
    import yaml

    from maxckpt.storage.bounded import yaml_alias_nodes

    assert yaml_alias_nodes(yaml.compose(json.dumps(list(range(20_000))))) == 0
    assert yaml_alias_nodes(yaml.compose("a: &a {x: 1}\nb: *a\n")) == 3  # b's copy of {x: 1}: a mapping, a key, a value


def test_yaml_alias_bombs_are_refused_by_what_the_aliases_add(tmp_path_factory):
    from maxckpt.config import load_config

    with pytest.raises(ConfigError, match=r"its aliases expand it by more than 100,000 values \(a YAML alias bomb\)"):
        load_config(_overlay(tmp_path_factory, _laughs(9, 9)))  # 9**9 values from 90 written ones
    with pytest.raises(ConfigError, match=r"a YAML alias refers to a node that contains it"):
        load_config(_overlay(tmp_path_factory, "a: &a [1, *a]\n"))


@pytest.mark.parametrize("tag", ["!!python/object:os.system {}", "!!python/object/apply:os.system ['id']", "!custom 5"])
def test_a_refused_yaml_tag_is_named_in_a_clear_message(tmp_path_factory, tag):
    from maxckpt.config import load_config

    path = _overlay(tmp_path_factory, f"run_name: {tag}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    name = tag.split(" ")[0]
    # It said "could not determine a constructor for the tag a character".
    assert str(info.value) == (
        f"config file {path} is not valid YAML (the tag {name} at line 1, column 11 is not allowed: only plain YAML is "
        "accepted (mappings, lists, strings, numbers, true/false, null), no tags that build objects)"
    )
