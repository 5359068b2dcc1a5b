"""An nftables transaction as a value: an ordered tuple of typed (verb, object) operations.

Modelled on knftables: an operation is a verb and one object of the nodelb table — a `Table`,
`Chain`, `Rule`, `Set`, `Map` or `Elements` value — and building a transaction does no I/O.
Two printers read the same values: rules/text.py writes exactly what `nft -f` reads (so tests
compare text, and libnftables applies it), and rules/netlink.py encodes element operations as
an nf_tables netlink batch (the agent's fast path). Nothing parses nft text back: what an op
creates, deletes or references is a field, not a substring.

Every object belongs to the nodelb table (rules/layout.py: `inet nodelb`), so no op can name
another table. The kernel applies a whole transaction as one batch: all of it or none of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

Verb = Literal["add", "delete", "flush"]

VerdictKind = Literal["accept", "drop", "continue", "return", "goto", "jump"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict as a verdict map's value: `goto`/`jump` name a chain, the others none."""

    kind: VerdictKind
    chain: str | None = None

    def __post_init__(self) -> None:
        if (self.kind in ("goto", "jump")) != (self.chain is not None):
            raise ValueError(f"verdict {self.kind!r} with chain {self.chain!r}")

    def text(self) -> str:
        """Return the verdict as nft writes it: `goto ep4_3`, `accept`."""
        return self.kind if self.chain is None else f"{self.kind} {self.chain}"


@dataclass(frozen=True, slots=True)
class Table:
    """The nodelb table. `comment` is set only when the table is created (nft keeps the
    comment of a table that exists); None writes no comment."""

    comment: str | None = None


@dataclass(frozen=True, slots=True)
class Hook:
    """A base chain's hook: `type nat hook prerouting priority dstnat - 10 ; policy accept`.

    `priority` is nft's priority expression (`dstnat - 10`, `-110`, `srcnat`), kept as written
    so the text printer emits what the kernel tests were checked against.
    """

    type: str
    hook: str
    priority: str
    policy: str = "accept"


@dataclass(frozen=True, slots=True)
class Chain:
    """A chain of the table; `hook` None is a regular chain (a goto/jump target)."""

    name: str
    hook: Hook | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule appended to `chain`. `expr` is the rule's nft expression, as nft reads it."""

    chain: str
    expr: str


@dataclass(frozen=True, slots=True)
class Set:
    """A named set. `key` is its type (`ipv4_addr . inet_proto . inet_service`), or its
    `typeof` expression when `typeof` is True; `flags` and `timeout` (seconds) as nft declares
    them. A flush or delete needs the name only (the other fields are then ignored)."""

    name: str
    key: str = ""
    flags: tuple[str, ...] = ()
    timeout: int | None = None
    typeof: bool = False


@dataclass(frozen=True, slots=True)
class Map:
    """A named map from `key` to `value` types (`typeof` expressions when `typeof` is True).
    A flush or delete needs the name only."""

    name: str
    key: str = ""
    value: str = ""
    typeof: bool = False


Atoms = tuple[str, ...]
"""An element key or data value: one string per field of a concatenation, as nft writes it
(`("198.18.0.10", "tcp", "80")`); a prefix field is written `198.19.0.0/16`."""

Item = tuple[Atoms, Atoms | Verdict | None]
"""One element: its key, and its value in a map (data atoms, or a Verdict in a verdict map);
None in a set, and in every deletion (nft deletes map elements by key)."""


@dataclass(frozen=True, slots=True)
class Elements:
    """Elements of the set or map `set`, in one op, as nft's `add element ... { a, b }` takes
    them: a full table holds ~100k elements in a few sets, and one op per set (not per
    element) keeps a full render to a few hundred objects."""

    set: str
    items: tuple[Item, ...]


Object = Table | Chain | Rule | Set | Map | Elements
ObjectKind = Literal["table", "chain", "rule", "set", "map", "element"]

_KIND: dict[type[Object], ObjectKind] = {
    Table: "table",
    Chain: "chain",
    Rule: "rule",
    Set: "set",
    Map: "map",
    Elements: "element",
}


def kind_of(obj: Object) -> ObjectKind:
    """Return the nft keyword of `obj`'s kind (`chain`, `element`, ...)."""
    return _KIND[type(obj)]


def name_of(obj: Object) -> str:
    """Return the name of the object `obj` creates, flushes or deletes: a chain's, set's or
    map's own name, the chain of a rule, the set of elements, "" for the table."""
    if isinstance(obj, Table):
        return ""
    if isinstance(obj, Rule):
        return obj.chain
    if isinstance(obj, Elements):
        return obj.set
    return obj.name


@dataclass(frozen=True, slots=True)
class Op:
    """One nft command: `verb` applied to `obj` (add a chain, flush a map, delete elements)."""

    verb: Verb
    obj: Object

    def text(self) -> str:
        """Return the command line nft reads, without a trailing newline (rules/text.py)."""
        from rules.text import op_text  # noqa: PLC0415  (the printer imports this module)

        return op_text(self)

    def target(self) -> tuple[ObjectKind, str]:
        """Return (kind, name) of the object: ("chain", "ep4_3"), ("element", "be4_3"),
        ("rule", the rule's chain), ("table", "")."""
        return kind_of(self.obj), name_of(self.obj)


@dataclass(frozen=True, slots=True)
class Transaction:
    """Return value of the renderers: the ordered operations of one atomic nft batch.

    An empty transaction means "nothing to do"; `text()` of it is the empty string.
    """

    ops: tuple[Op, ...] = ()

    @classmethod
    def of(cls, ops: Iterable[Op]) -> Transaction:
        """Return a transaction holding `ops` in order."""
        return cls(tuple(ops))

    def text(self) -> str:
        """Return the transaction as `nft -f` input: one command per line, newline-terminated."""
        from rules.text import transaction_text  # noqa: PLC0415  (see Op.text)

        return transaction_text(self)

    def element_count(self) -> tuple[int, int]:
        """Return (elements added, elements deleted) by the element ops."""
        added = deleted = 0
        for op in self.ops:
            if isinstance(op.obj, Elements):
                if op.verb == "add":
                    added += len(op.obj.items)
                elif op.verb == "delete":
                    deleted += len(op.obj.items)
        return added, deleted

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __add__(self, other: Transaction) -> Transaction:
        if not isinstance(other, Transaction):
            return NotImplemented
        return Transaction(self.ops + other.ops)
