"""An nftables transaction as a value: an ordered tuple of (verb, object) operations.

Modelled on knftables: building a transaction does no I/O, and `Transaction.text()` is exactly
what `nft -f` reads, so tests compare text or apply it to a fake. The kernel applies the whole
text as one batch: all of it or none of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

Verb = Literal["add", "delete", "flush"]


@dataclass(frozen=True, slots=True)
class Op:
    """One nft command: `verb obj`, e.g. `add element inet nodelb ext4 { ... }`.

    `obj` is the object part of the command exactly as nft reads it (`table inet nodelb`,
    `chain inet nodelb ep4_3`, `rule inet nodelb ep4_3 ...`, `element inet nodelb be4_3 {...}`).
    """

    verb: Verb
    obj: str

    def text(self) -> str:
        """Return the command line nft reads, without a trailing newline."""
        return f"{self.verb} {self.obj}"

    def target(self, table: str) -> tuple[str, str]:
        """Return (kind, name) of the object: ("chain", "ep4_3") for `chain inet nodelb ep4_3`
        with `table` "inet nodelb". The name is "" for a table, and for an object of another
        table."""
        kind, _, rest = self.obj.partition(" ")
        prefix = table + " "
        if kind == "table" or not rest.startswith(prefix):
            return kind, ""
        return kind, rest[len(prefix) :].split(" ", 1)[0]


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
        if not self.ops:
            return ""
        return "\n".join([op.verb + " " + op.obj for op in self.ops]) + "\n"

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __add__(self, other: Transaction) -> Transaction:
        if not isinstance(other, Transaction):
            return NotImplemented
        return Transaction(self.ops + other.ops)
