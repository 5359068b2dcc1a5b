"""Typed reads of a parsed config document (pure): each value checked against its key's type.

A YAML document can hold anything where a key expects a number: a list, a mapping, a quoted
string, null, a date, an integer of a thousand digits, a mapping with integer keys. Every
reader here checks the type first and raises `ConfigError` naming the key path
(``pools[0].addresses``) and the expected type, so nothing past the config parsers ever sees
a value of the wrong type, and no TypeError or OverflowError escapes them.

Booleans are YAML booleans only: the string ``"false"`` is refused, not read as true.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set
from typing import Any


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key path and the expected type."""


def describe(value: Any) -> str:
    """Return a short description of `value`'s type and value for an error message."""
    kinds: tuple[tuple[type, str], ...] = (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "a list"),
        (Mapping, "a mapping"),
    )
    if value is None:
        return "null"
    kind = next((name for t, name in kinds if isinstance(value, t)), type(value).__name__)
    text = repr(value)
    return f"{kind} {text[:60]}{'...' if len(text) > 60 else ''}"


def wrong(where: str, expected: str, value: Any) -> ConfigError:
    """Return the error for `value` found at `where` instead of `expected`."""
    return ConfigError(f"{where}: expected {expected}, got {describe(value)}")


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    """Return `value` as a mapping with string keys; ConfigError for anything else."""
    if not isinstance(value, Mapping):
        raise wrong(where, "a mapping", value)
    for key in value:
        if not isinstance(key, str):
            raise ConfigError(f"{where}: keys must be strings, got {describe(key)}")
    return value


def section(raw: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """Return the mapping under `key`; absent or null (every key commented out): empty."""
    if raw.get(key) is None:
        return {}
    return mapping(raw[key], where)


def known_keys(raw: Mapping[str, Any], known: Set[str], where: str) -> None:
    """Raise ConfigError naming the keys of `raw` outside `known` (a typo never goes unseen)."""
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown {where} keys: {', '.join(unknown)}")


def boolean(raw: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    """Return the boolean under `key` (absent: `default`); only true or false is accepted."""
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise wrong(where, "true or false", value)
    return value


def integer(raw: Mapping[str, Any], key: str, default: int, where: str, *, lo: int, hi: int) -> int:
    """Return the integer in lo..hi under `key` (absent: `default`)."""
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise wrong(where, f"an integer in {lo}..{hi}", value)
    return value


def optional_integer(
    raw: Mapping[str, Any], key: str, where: str, *, lo: int, hi: int
) -> int | None:
    """Return the integer in lo..hi under `key`, or None when absent or null."""
    if raw.get(key) is None:
        return None
    return integer(raw, key, 0, where, lo=lo, hi=hi)


def number(
    raw: Mapping[str, Any], key: str, default: float, where: str, *, lo: float, hi: float
) -> float:
    """Return the finite number in lo..hi under `key` (absent: `default`), as a float.

    The range is checked before the conversion: a huge integer would overflow a float.
    """
    value = raw.get(key, default)
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or (isinstance(value, float) and not math.isfinite(value))
        or not lo <= value <= hi
    ):
        raise wrong(where, f"a number in {lo:g}..{hi:g}", value)
    return float(value)


def optional_number(
    raw: Mapping[str, Any], key: str, where: str, *, lo: float, hi: float
) -> float | None:
    """Return the number in lo..hi under `key`, or None when absent or null."""
    if raw.get(key) is None:
        return None
    return number(raw, key, 0.0, where, lo=lo, hi=hi)


def string(raw: Mapping[str, Any], key: str, default: str, where: str) -> str:
    """Return the non-empty string under `key` (absent: `default`)."""
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise wrong(where, "a non-empty string", value)
    return value


def string_list(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    """Return the list of strings under `key` (absent: empty); null is refused."""
    if key not in raw:
        return ()
    value = raw[key]
    if not isinstance(value, list):
        raise wrong(where, "a list of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise wrong(f"{where}[{i}]", "a string", item)
    return tuple(value)


def string_map(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """Return a mapping of strings to strings as sorted pairs (labels)."""
    m = mapping(value, where)
    for k, v in m.items():
        if not isinstance(v, str):
            raise wrong(f"{where}.{k}", "a string", v)
    return tuple(sorted(m.items()))
