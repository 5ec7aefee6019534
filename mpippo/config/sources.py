"""Where a config comes from: a YAML file (read strictly: no duplicate keys, no tags that build
objects, a size bound) and `--set section.key=value` overrides merged into it."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from mpippo.config.schema import MAX_CONFIG_BYTES, SECTIONS, mapping_keys
from mpippo.errors import os_reason
from mpippo.rules import show
from mpippo.usage import UsageError, file_kind


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error (PyYAML keeps
    the last one silently, so a forgotten earlier line would win without a word)."""


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one mapping (refused in a file and in --set alike)."""


def _strict_mapping(loader, node, deep=False):
    first_line = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            seen = first_line.get(key)
        except TypeError:  # an unhashable key: construct_mapping below says so
            continue
        if seen is not None:
            raise _DuplicateKey(None, None, f"duplicate key {show(key)} (first given at line {seen})",
                                                    key_node.start_mark)
        first_line[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)


class _TypedLoader(_StrictLoader):
    """What a person types (a config file, --set): 1e-3 and 1.5e3 are floats, as in YAML 1.2 and to every
    user; PyYAML's YAML 1.1 wants a dot and a signed exponent (1.0e-3, 1.5e+3) and reads the others as
    text, which a setting's type check took back but env.kwargs passed on to the user's env as a string.
    Files mpippo wrote (a run's config.yaml, by PyYAML's YAML 1.1 dumper, which leaves the text 1e5
    unquoted) are read back with _StrictLoader, as they were written."""


_TypedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


def _kind(path: Path) -> str:
    return file_kind(path.stat().st_mode)


def _read_text(path: Path) -> str:
    """The file's text, or one UsageError line naming the path and what is wrong with it."""
    try:
        if path.is_dir():
            raise UsageError(f"config file: '{path}' is a folder; give a YAML file")
        if not path.is_file():
            if path.exists():  # a FIFO would block the read, a device never end it
                raise UsageError(f"config file: '{path}' is {_kind(path)}, not a regular file; give a YAML file")
            raise UsageError(f"config file not found: '{path}'")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UsageError(f"config file '{path}' has {path.stat().st_size:,} bytes; a config is a small YAML "
                              f"file (at most {MAX_CONFIG_BYTES:,} bytes)")
        raw = path.read_bytes()
    except OSError as e:  # permissions, a name too long, an I/O error
        raise UsageError(f"config file '{show(str(path))}': cannot read it ({os_reason(e)})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"config file '{path}' is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                          f"save it as UTF-8") from None


def _unreadable(e: ValueError) -> str:
    """A value PyYAML's constructors raise ValueError on: an int past Python's 4,300-digit guard
    against quadratic parsing, a date that does not exist (2001-13-45)."""
    if "integer string conversion" in str(e):
        return "a number of more than 4,300 digits"
    return f"a value it cannot read ({str(e).splitlines()[0] if str(e) else type(e).__name__})"


def load_yaml(path: str | Path, ours: bool = False) -> dict:
    """A config file as nested dicts: UTF-8 YAML whose top level is a mapping of sections. `ours`: a
    file mpippo wrote (a run's config.yaml), read as it was written (_TypedLoader says why)."""
    path = Path(path)
    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=_StrictLoader if ours else _TypedLoader)  # SafeLoaders: build only plain data
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"malformed YAML in '{path}'{where}: {problem}") from None
    except RecursionError:
        raise UsageError(f"malformed YAML in '{path}': nested too deeply") from None
    except ValueError as e:  # from PyYAML's constructors, not a YAMLError
        raise UsageError(f"malformed YAML in '{path}': {_unreadable(e)}") from None
    check_expansion(data, f"config file '{path}'")
    if data is None:  # an empty file: every default
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file '{path}': the top level must be a mapping of sections ({', '.join(SECTIONS)}), "
                          f"got {show(data)} ({type(data).__name__})")
    return data


MAX_VALUES = 100_000  # far above any config; a 1 KB "billion laughs" of aliases expands to billions


def check_expansion(data, where: str) -> None:
    """Refuse YAML data whose aliases expand to more than MAX_VALUES values. Its anchors make one
    object of many references, which every later walk over it (a check, a message's repr, a copy)
    expands in full: hours and gigabytes from a few lines. The count stops at the limit."""
    stack, count = [data], 0
    while stack:
        value = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise UsageError(f"{where}: its anchors and aliases (&, *) expand to more than {MAX_VALUES:,} values; "
                             f"allowed: up to {MAX_VALUES:,}")
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def parse_override(item: str) -> tuple[str, str, Any]:
    """'section.key=value' -> (section, key, YAML-typed value)."""
    if "=" not in item or "." not in item.split("=", 1)[0]:
        raise UsageError(f"--set expects section.key=value, got '{item}'")
    dotted, raw = item.split("=", 1)
    section, key = dotted.split(".", 1)
    try:
        value = yaml.load(raw, Loader=_TypedLoader) if raw != "" else ""  # (as a config file's values: 1e-3 a float)
    except _DuplicateKey as e:  # (a file's rule: the later one would win unseen)
        raise UsageError(f"--set {dotted}: {e.problem}") from None
    except yaml.YAMLError:
        value = raw
    except RecursionError:
        raise UsageError(f"--set {dotted}: its YAML value is nested too deeply") from None
    except ValueError as e:
        why = _unreadable(e)
        if why.startswith("a value"):  # (a date-like text meant as a string: quoting makes it one)
            why += f"; quote it for text: {dotted}=\"'{show(raw)[1:-1]}'\""
        raise UsageError(f"--set {dotted}: {why}") from None
    check_expansion(value, f"--set {dotted}")
    return section, key, value


def merge_overrides(data: dict, overrides: list[tuple[str, str, Any]]) -> dict:
    """The overrides over the file's data (neither is changed). `section.key.entry=value` sets one entry
    of a mapping key (`env.kwargs.noop_max=0`), where `section.key={...}` replaces the whole mapping."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (data or {}).items()}
    mappings = mapping_keys()
    for section, key, value in overrides:
        sec = data.get(section)
        if sec is None:
            sec = data[section] = {}
        if not isinstance(sec, dict):  # a section that is not a mapping stays as it is: from_dict reports it
            continue
        head, _, entry = key.partition(".")
        if entry and (section, head) in mappings and isinstance(sec.get(head, {}), (dict, type(None))):
            sec[head] = {**(sec.get(head) or {}), entry: value}
        else:  # (a damaged mapping stays as it is, with the dotted key beside it: from_dict reports both)
            sec[key] = value
    return data


