"""A knftables-style fake of the nodelb table for unit tests: applies Transactions in memory.

It understands exactly the commands rules/ emits (table, chain, rule, set, map, element with
add / delete / flush; like the kernel, `flush table` empties the chains but not the sets and
maps, and `add table` keeps the comment of a table that exists) and checks, as the kernel
would, that every `goto`/`jump`/`@set` reference exists when a rule or element is added, that
a deleted chain or set is no longer referenced, that deleted elements exist, and (stricter
than the kernel) that an added element key is not already present. A transaction applies
atomically: on any error the table is left as it was and FakeError is raised.

It also refuses what nft 1.0.6 refuses: a rule that reads a map declared `typeof ... th dport`
which the batch did not create itself (nft loads it from the kernel and cannot re-evaluate its
`th dport` value: "conflicting protocols specified: ip vs. th").
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from rules.layout import TABLE
from rules.text import atoms_text, item_text, object_text
from rules.transaction import Chain, Elements, Map, Op, Rule, Set, Table, Transaction, Verdict

_REF = re.compile(r"(?:goto|jump) ([A-Za-z0-9_]+)|@([A-Za-z0-9_]+)")


class FakeError(Exception):
    """A command the kernel would refuse; the message names the command."""


@dataclass
class FakeTable:
    """In-memory state of `inet nodelb`; `exists` is False until a table is added.

    The state is kept as nft lists it (rule expressions, declarations and elements as text),
    so snapshots compare with what the kernel shows; the ops themselves arrive typed.
    """

    exists: bool = False
    comment: str = ""
    chains: dict[str, list[str]] = field(default_factory=dict)
    chain_specs: dict[str, str] = field(default_factory=dict)
    set_specs: dict[str, str] = field(default_factory=dict)
    elements: dict[str, dict[str, str | None]] = field(default_factory=dict)
    _fresh: set[str] = field(default_factory=set)  # maps created by the running batch

    # -- applying ---------------------------------------------------------------------------

    def apply(self, tx: Transaction) -> None:
        """Apply `tx` atomically, or raise FakeError and change nothing."""
        work = copy.deepcopy(self)
        work._fresh = set()
        for op in tx:
            try:
                work._apply_op(op)
            except FakeError as e:
                raise FakeError(f"{op.text()[:300]}: {e}") from None
        work._fresh = set()
        self.__dict__.update(work.__dict__)

    def _apply_op(self, op: Op) -> None:
        obj = op.obj
        if isinstance(obj, Table):
            self._table(op.verb, obj)
            return
        if not self.exists:
            raise FakeError("no such table")
        if isinstance(obj, Chain):
            self._chain(op.verb, obj.name, _spec(op))
        elif isinstance(obj, Rule):
            if op.verb != "add" or obj.chain not in self.chains:
                raise FakeError("bad rule command or no such chain")
            self._check_refs(obj.expr)
            for ref in _refs(obj.expr):
                spec = self.set_specs.get(ref, "")
                if "th dport" in spec.partition(":")[2] and ref not in self._fresh:
                    raise FakeError(
                        f"nft 1.0.6: conflicting protocols specified: ip vs. th ({ref})"
                    )
            self.chains[obj.chain].append(obj.expr)
        elif isinstance(obj, Set | Map):
            kind = "map" if isinstance(obj, Map) else "set"
            self._set(op.verb, obj.name, kind, f"{kind} {_spec(op)}")
        else:
            self._element(op.verb, obj)

    def _table(self, verb: str, obj: Table) -> None:
        if verb == "add":
            if not self.exists:
                self.comment = obj.comment or ""
            self.exists = True
        elif verb == "flush":
            if not self.exists:
                raise FakeError("no such table")
            for name in self.chains:
                self.chains[name] = []
        elif verb == "delete":
            if not self.exists:
                raise FakeError("no such table")
            self.__dict__.update(FakeTable().__dict__)
        else:
            raise FakeError(f"table {verb}")

    def _chain(self, verb: str, name: str, spec: str) -> None:
        if verb == "add":
            if name in self.chains:
                if spec and spec != self.chain_specs[name]:
                    raise FakeError("chain exists with another definition")
                return
            self.chains[name] = []
            self.chain_specs[name] = spec
        elif verb == "flush":
            if name not in self.chains:
                raise FakeError("no such chain")
            self.chains[name] = []
        elif verb == "delete":
            if name not in self.chains:
                raise FakeError("no such chain")
            users = self._users(name, exclude_chain=name)
            if users:
                raise FakeError(f"chain {name} still referenced by {users[:3]}")
            del self.chains[name]
            del self.chain_specs[name]

    def _set(self, verb: str, name: str, kind: str, spec: str) -> None:
        if verb == "add":
            if name in self.set_specs:
                if spec != self.set_specs[name]:
                    raise FakeError("set exists with another definition")
                return
            self.set_specs[name] = spec
            self.elements[name] = {}
            self._fresh.add(name)
        elif verb == "delete":
            if name not in self.set_specs:
                raise FakeError("no such set")
            users = self._users(name, exclude_chain=None)
            if users:
                raise FakeError(f"set {name} still referenced by {users[:3]}")
            del self.set_specs[name]
            del self.elements[name]
        elif verb == "flush":
            if name not in self.set_specs:
                raise FakeError("no such set")
            if not self.set_specs[name].startswith(kind):
                raise FakeError("flush of a set as a map or of a map as a set")
            self.elements[name] = {}
        else:
            raise FakeError(f"set {verb}")

    def _element(self, verb: str, obj: Elements) -> None:
        name = obj.set
        if name not in self.elements:
            raise FakeError("no such set or map")
        if not obj.items:
            raise FakeError("empty element list")
        is_map = self.set_specs[name].startswith("map")
        elems = self.elements[name]
        for item in obj.items:
            key_atoms, value = item
            key = atoms_text(key_atoms)
            if verb == "add":
                if is_map != (value is not None):
                    raise FakeError(f"element {item_text(item)!r} does not fit {name}")
                if key in elems:
                    raise FakeError(f"element {key!r} already in {name}")
                if isinstance(value, Verdict) and value.chain not in (None, *self.chains):
                    raise FakeError(f"no such chain {value.chain}")
                if value is None:
                    elems[key] = None
                else:
                    elems[key] = atoms_text(value) if isinstance(value, tuple) else value.text()
            elif verb == "delete":
                if key not in elems:
                    raise FakeError(f"element {key!r} not in {name}")
                del elems[key]
            else:
                raise FakeError(f"element {verb}")

    def _check_refs(self, text: str) -> None:
        for chain, setname in _REF.findall(text):
            if chain and chain not in self.chains:
                raise FakeError(f"no such chain {chain}")
            if setname and setname not in self.set_specs:
                raise FakeError(f"no such set {setname}")

    def _users(self, name: str, *, exclude_chain: str | None) -> list[str]:
        users: list[str] = []
        for chain, rules in self.chains.items():
            if chain == exclude_chain:
                continue
            users += [f"{chain}: {r}" for r in rules if name in _refs(r)]
        for setname, elems in self.elements.items():
            users += [f"{setname}: {k}" for k, v in elems.items() if v and name in _refs(v)]
        return users

    # -- reading ----------------------------------------------------------------------------

    def verdict_targets(self) -> set[str]:
        """Return every chain named by a verdict in a map element or a rule."""
        out: set[str] = set()
        for elems in self.elements.values():
            for v in elems.values():
                if v:
                    out |= _refs(v)
        for rules in self.chains.values():
            for r in rules:
                out |= _refs(r)
        return out

    def normalized(self) -> dict[str, object]:
        """Return a comparable snapshot: every chain with its rules, every set with elements."""
        chains = {n: (self.chain_specs[n], tuple(r)) for n, r in self.chains.items()}
        sets = {n: (spec, dict(self.elements[n])) for n, spec in self.set_specs.items()}
        return {"exists": self.exists, "chains": chains, "sets": sets}

    def terse(self) -> str | None:
        """Return the table as `nft -t list table` shows it (None if absent)."""
        if not self.exists:
            return None
        lines = [f"table {TABLE} {{"]
        if self.comment:
            lines.append(f'\tcomment "{self.comment}"')
        for name, spec in self.set_specs.items():
            kind, _, decl = spec.partition(" ")
            lines += [f"\t{kind} {name} {{", f"\t\t{decl.strip('{} ')}", "\t}"]
        for name, rules in self.chains.items():
            lines.append(f"\tchain {name} {{")
            if self.chain_specs[name]:
                lines.append(f"\t\t{self.chain_specs[name].strip('{} ')}")
            lines += [f"\t\t{r}" for r in rules]
            lines.append("\t}")
        lines.append("}")
        return "\n".join(lines) + "\n"


def _spec(op: Op) -> str:
    """Return what follows an object's name in its command: a chain's hook block, a set's or
    map's declaration ("" for a regular chain, and for every flush or delete)."""
    kind, name = op.target()
    text = object_text(op)
    return text[len(f"{kind} {TABLE} {name}") :].strip()


def _refs(text: str) -> set[str]:
    return {a or b for a, b in _REF.findall(text)}


def applied(*txs: Transaction) -> FakeTable:
    """Return a fresh FakeTable with `txs` applied in order."""
    table = FakeTable()
    for tx in txs:
        table.apply(tx)
    return table
