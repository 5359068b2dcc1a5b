"""The text printer: typed nft operations as the commands `nft -f` (libnftables) reads.

One command per op, e.g. `add element inet nodelb be4_3 { 198.18.0.10 . tcp . 80 . 0 :
198.19.1.5 . 8080 }`. Element atoms are joined, never re-parsed: the other printer,
rules/netlink.py, encodes the same values into netlink attributes.
"""

from __future__ import annotations

from rules import layout as L
from rules.transaction import Atoms, Chain, Elements, Item, Map, Op, Rule, Set, Table, Transaction

_T = L.TABLE


def atoms_text(atoms: Atoms) -> str:
    """Return a key or data value as nft writes it: atoms joined by " . "."""
    return " . ".join(atoms)


def item_text(item: Item) -> str:
    """Return one element as nft writes it: `key` or `key : value`."""
    key, value = item
    if value is None:
        return " . ".join(key)
    if isinstance(value, tuple):
        return " . ".join(key) + " : " + " . ".join(value)
    return " . ".join(key) + " : " + value.text()


def _declaration(obj: Set | Map) -> str:
    """Return the braced body of a set or map declaration."""
    word = "typeof" if obj.typeof else "type"
    if isinstance(obj, Map):
        return f"{{ {word} {obj.key} : {obj.value} ; }}"
    body = f"{word} {obj.key} ;"
    if obj.flags:
        body += f" flags {','.join(obj.flags)} ;"
    if obj.timeout is not None:
        body += f" timeout {obj.timeout}s ;"
    return f"{{ {body} }}"


def object_text(op: Op) -> str:
    """Return the object part of `op`'s command (`chain inet nodelb ep4_3`, ...)."""
    obj = op.obj
    add = op.verb == "add"
    if isinstance(obj, Elements):
        # Inline rather than item_text per element: a full table prints ~100k of them.
        dot = " . ".join
        body = ", ".join(
            [
                dot(k)
                if v is None
                else dot(k) + " : " + (dot(v) if isinstance(v, tuple) else v.text())
                for k, v in obj.items
            ]
        )
        return f"element {_T} {obj.set} {{ {body} }}"
    if isinstance(obj, Rule):
        return f"rule {_T} {obj.chain} {obj.expr}"
    if isinstance(obj, Chain):
        h = obj.hook
        if not add or h is None:
            return f"chain {_T} {obj.name}"
        return (
            f"chain {_T} {obj.name} {{ type {h.type} hook {h.hook} priority {h.priority} ; "
            f"policy {h.policy} ; }}"
        )
    if isinstance(obj, Set | Map):
        kind = "map" if isinstance(obj, Map) else "set"
        if not add:
            return f"{kind} {_T} {obj.name}"
        return f"{kind} {_T} {obj.name} {_declaration(obj)}"
    assert isinstance(obj, Table)
    if add and obj.comment is not None:
        return f'table {_T} {{ comment "{obj.comment}" ; }}'
    return f"table {_T}"


def op_text(op: Op) -> str:
    """Return `op` as one nft command line, without a trailing newline."""
    return op.verb + " " + object_text(op)


def transaction_text(tx: Transaction) -> str:
    """Return `tx` as `nft -f` input: one command per line, newline-terminated ("" if empty)."""
    if not tx.ops:
        return ""
    return "\n".join([op_text(op) for op in tx.ops]) + "\n"
