"""Kubernetes label selectors: one value type for every selector nodelb reads, and its parser.

Pools select Services and Namespaces (`serviceSelector`, `namespaceSelector`), the announcer
selects the nodes that may hold addresses (`announce.nodeSelector`); all three are
metav1.LabelSelector, with matchLabels and matchExpressions, and mean what they mean in the
API: every pair and every requirement must hold, and an empty selector matches everything.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.model.config_values import (
    ConfigError,
    known_keys,
    mapping,
    string,
    string_list,
    string_map,
    wrong,
)


class SelectorOperator(enum.StrEnum):
    """A label selector requirement's operator, spelled as in Kubernetes' LabelSelector."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions entry; `values` is used by In and NotIn only."""

    key: str
    operator: SelectorOperator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Return whether `labels` satisfy this requirement (Kubernetes semantics)."""
        value = labels.get(self.key)
        if self.operator is SelectorOperator.IN:
            return value is not None and value in self.values
        if self.operator is SelectorOperator.NOT_IN:
            return value is None or value not in self.values
        if self.operator is SelectorOperator.EXISTS:
            return value is not None
        return value is None


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """Every matchLabels pair and every requirement must hold; empty matches everything."""

    match_labels: frozenset[tuple[str, str]] = frozenset()
    match_expressions: frozenset[Requirement] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Return whether an object with `labels` is selected."""
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.match_expressions
        )


def parse_label_selector(value: Any, where: str) -> LabelSelector:
    """Return the selector written at `where` (a metav1.LabelSelector mapping).

    Raises ConfigError naming the key path: a wrong type anywhere, an unknown key or
    operator, values given to Exists/DoesNotExist or missing for In/NotIn (the API server
    refuses both).
    """
    sel = mapping(value, where)
    known_keys(sel, {"matchLabels", "matchExpressions"}, where)
    labels = (
        ()
        if sel.get("matchLabels") is None
        else string_map(sel["matchLabels"], f"{where}.matchLabels")
    )
    exprs = sel.get("matchExpressions")
    if exprs is None:
        exprs = []
    if not isinstance(exprs, list):
        raise wrong(f"{where}.matchExpressions", "a list", exprs)
    reqs: list[Requirement] = []
    for i, item in enumerate(exprs):
        at = f"{where}.matchExpressions[{i}]"
        expr = mapping(item, at)
        known_keys(expr, {"key", "operator", "values"}, at)
        key = string(expr, "key", "", f"{at}.key")
        operator = string(expr, "operator", "", f"{at}.operator")
        try:
            op = SelectorOperator(operator)
        except ValueError:
            raise ConfigError(
                f"{at}.operator: {operator!r} is not one of "
                f"{', '.join(o.value for o in SelectorOperator)}"
            ) from None
        values = frozenset(string_list(expr, "values", f"{at}.values"))
        if op in (SelectorOperator.IN, SelectorOperator.NOT_IN) and not values:
            raise ConfigError(f"{at}.values: {op.value} needs at least one value")
        if op in (SelectorOperator.EXISTS, SelectorOperator.DOES_NOT_EXIST) and values:
            raise ConfigError(f"{at}.values: {op.value} takes no values")
        reqs.append(Requirement(key, op, values))
    return LabelSelector(match_labels=frozenset(labels), match_expressions=frozenset(reqs))
