"""Normalized snapshots of the nodelb table, to compare the kernel with the applier's mirror.

`expected(desired)` says what `render(desired)` puts in the table; `from_json(nft_json)` reads
what `nft -j list table inet nodelb` shows. Both return a `Snapshot` of plain data, so drift is
`expected(mirror) != from_json(kernel)`, and `differences` names what differs. Pure: no I/O.

Normalization (what is compared and what is not):
- every set and map by name, with its elements as canonical strings `key` or `key : value`
  (atoms joined by " . ", addresses in `ipaddress` text form, a full-length prefix written as
  a plain address, verdicts as `goto <chain>` / `accept` / ...);
- the elements of session-affinity sets (`afa…`) are not compared: the kernel fills them with
  client addresses at run time; only their existence is;
- every chain by name, with its number of rules (rule text is not compared).
Nothing else is left out: a dispatch chain or backend map no frontend uses is a difference.

`kernel_objects(text)` reads the terse listing (`nft -t list table inet nodelb`: declarations
and rules, no set elements) into the `KernelObjects` a full render needs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.model.desired_state import DesiredState
from rules import layout as L
from rules.plan import Contributions, Emitter, dispatch_ops, node_elements
from rules.render import KernelObjects, base_chain_ops, priority_value, skeleton_ops
from rules.transaction import Atoms, Chain, Item, Map, Op, Rule, Set


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The comparable content of the nodelb table.

    `present` is False when the table does not exist (then `sets` and `chains` are empty).
    `sets` maps every set and map name to its canonical element strings; `chains` maps every
    chain name to its rule count.
    """

    present: bool
    sets: Mapping[str, frozenset[str]] = field(default_factory=dict)
    chains: Mapping[str, int] = field(default_factory=dict)

    def element_count(self) -> int:
        """Return the number of set and map elements in the snapshot."""
        return sum(len(v) for v in self.sets.values())

    def differences(self, other: Snapshot, *, limit: int = 20) -> list[str]:
        """Return one line per difference from self (expected) to `other` (actual), at most
        `limit` lines plus a count of the rest; empty when the snapshots are equal."""
        out: list[str] = []
        if self.present != other.present:
            out.append(f"table present: expected {self.present}, found {other.present}")
        for name in sorted(self.sets.keys() | other.sets.keys()):
            a, b = self.sets.get(name), other.sets.get(name)
            if a is None:
                out.append(f"unexpected set/map {name}")
            elif b is None:
                out.append(f"missing set/map {name}")
            else:
                out.extend(f"{name}: missing element {e}" for e in sorted(a - b))
                out.extend(f"{name}: unexpected element {e}" for e in sorted(b - a))
        for name in sorted(self.chains.keys() | other.chains.keys()):
            ca, cb = self.chains.get(name), other.chains.get(name)
            if ca is None:
                out.append(f"unexpected chain {name}")
            elif cb is None:
                out.append(f"missing chain {name}")
            elif ca != cb:
                out.append(f"chain {name}: expected {ca} rules, found {cb}")
        if len(out) > limit:
            out = [*out[:limit], f"... and {len(out) - limit} more"]
        return out


ABSENT = Snapshot(present=False)
"""The snapshot of a namespace with no nodelb table."""


def _canon_atom(atom: str) -> str:
    """Return the canonical text of one element atom (address, prefix, or anything else)."""
    if "." not in atom and ":" not in atom:
        return atom
    try:
        if "/" in atom:
            net = ipaddress.ip_network(atom, strict=False)
            if net.prefixlen == net.max_prefixlen:
                return str(net.network_address)
            return net.with_prefixlen
        return str(ipaddress.ip_address(atom))
    except ValueError:
        return atom


class CanonicalAtoms(dict[str, str]):
    """Atom -> canonical text (`_canon_atom`), memoised for one read-back or one `expected`.

    Atoms repeat within a table (a frontend's address in each of its endpoints' elements), so
    a memo halves the parsing. It must not outlive the call: a module-wide cache kept its last
    65,536 atoms, allocated in the middle of a 10k-Service comparison, alive afterwards, and
    those scattered strings held ~30 MB of otherwise free heap pages in the agent (see
    docs/decisions.md).
    """

    def __missing__(self, atom: str) -> str:
        text = self[atom] = _canon_atom(atom)
        return text


def _canon_atoms(atoms: Atoms, canon: CanonicalAtoms) -> str:
    return " . ".join([canon[a] for a in atoms])


def canonical_item(item: Item, canon: CanonicalAtoms | None = None) -> str:
    """Return a rendered element in the canonical text the read-backs produce: `key` or
    `key : value`, every address atom in `ipaddress` form, a verdict as nft writes it.
    `canon` memoises atoms across the items of one call."""
    memo = CanonicalAtoms() if canon is None else canon
    key, value = item
    if value is None:
        return _canon_atoms(key, memo)
    if isinstance(value, tuple):
        return _canon_atoms(key, memo) + " : " + _canon_atoms(value, memo)
    return _canon_atoms(key, memo) + " : " + value.text()


def _is_dynamic(name: str) -> bool:
    return name.startswith(L.AFF_SET)


def _structure(ops: Iterable[Op], sets: dict[str, frozenset[str]], chains: dict[str, int]) -> None:
    """Record the sets, maps, chains and rule counts that `ops` create."""
    for op in ops:
        if op.verb != "add":
            continue
        obj = op.obj
        if isinstance(obj, Set | Map):
            sets.setdefault(obj.name, frozenset())
        elif isinstance(obj, Chain):
            chains.setdefault(obj.name, 0)
        elif isinstance(obj, Rule):
            chains[obj.chain] = chains.get(obj.chain, 0) + 1


def expected(desired: DesiredState, *, mark: int = L.DEFAULT_MASQ_MARK) -> Snapshot:
    """Return the snapshot of the table `rules.render.render(desired)` builds.

    Raises RenderError (from rules/plan.py) if `desired` cannot be rendered.
    """
    acc = Contributions()
    emitter = Emitter(mark)
    for fe in desired.frontends.values():
        emitter.emit(acc, fe)
    sets: dict[str, frozenset[str]] = {}
    chains: dict[str, int] = {}
    _structure(skeleton_ops(mark), sets, chains)
    for dkey in sorted(acc.dispatch):
        _structure(dispatch_ops(dkey, mark), sets, chains)
    for unit in acc.units.values():
        _structure(unit.add, sets, chains)
    _structure(base_chain_ops(mark), sets, chains)
    elements: dict[str, list[Item]] = dict(acc.elements)
    elements.update(node_elements(desired))
    canon = CanonicalAtoms()
    for name, items in elements.items():
        if _is_dynamic(name):
            continue
        sets[name] = frozenset([canonical_item(item, canon) for item in items])
    return Snapshot(present=True, sets=sets, chains=chains)


def _json_atom(value: Any, canon: CanonicalAtoms) -> str:
    """Return the canonical text of one JSON element atom."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return canon[value]
    if isinstance(value, dict):
        if "concat" in value:
            return " . ".join(_json_atom(v, canon) for v in value["concat"])
        if "prefix" in value:
            p = value["prefix"]
            return canon[f"{p['addr']}/{p['len']}"]
        if "range" in value:
            lo, hi = value["range"]
            return f"{_json_atom(lo, canon)}-{_json_atom(hi, canon)}"
        if "elem" in value:
            return _json_atom(value["elem"]["val"], canon)
        for verdict in ("goto", "jump"):
            if verdict in value:
                return f"{verdict} {value[verdict]['target']}"
        if len(value) == 1:  # accept, drop, continue, return: {"accept": null}
            return str(next(iter(value)))
    return repr(value)


def _json_element(elem: Any, canon: CanonicalAtoms) -> str:
    if isinstance(elem, list) and len(elem) == 2:
        return f"{_json_atom(elem[0], canon)} : {_json_atom(elem[1], canon)}"
    return _json_atom(elem, canon)


def from_json(nft_json: Mapping[str, Any] | None) -> Snapshot:
    """Return the snapshot of `nft -j list table inet nodelb` output (None: table absent).

    Objects of other tables, if present in the input, are ignored.
    """
    if nft_json is None:
        return ABSENT
    present = False
    sets: dict[str, frozenset[str]] = {}
    chains: dict[str, int] = {}
    canon = CanonicalAtoms()
    for item in nft_json.get("nftables", ()):
        if not isinstance(item, dict) or len(item) != 1:
            continue
        ((kind, obj),) = item.items()
        if not isinstance(obj, dict):
            continue
        if kind == "table":
            if obj.get("family") == L.TABLE_FAMILY and obj.get("name") == L.TABLE_NAME:
                present = True
            continue
        if obj.get("family") != L.TABLE_FAMILY or obj.get("table") != L.TABLE_NAME:
            continue
        if kind in ("set", "map"):
            name = obj["name"]
            if _is_dynamic(name):
                sets[name] = frozenset()
            else:
                sets[name] = frozenset(_json_element(e, canon) for e in obj.get("elem", ()))
        elif kind == "chain":
            chains.setdefault(obj["name"], 0)
        elif kind == "rule":
            chains[obj["chain"]] = chains.get(obj["chain"], 0) + 1
    if not present:
        return ABSENT
    return Snapshot(present=True, sets=sets, chains=chains)


_HOOK = re.compile(
    r"type (\w+) hook (\w+)(?: device \S+)? priority ([^;]+?)\s*;(?:\s*policy (\w+))?"
)


def listed_hook_spec(line: str) -> str:
    """Return the canonical hook (rules.render.hook_spec's form) of a base chain's line in an
    nft listing (`type nat hook prerouting priority dstnat - 10; policy accept;`), "" if none.
    """
    m = _HOOK.search(line)
    if m is None:
        return ""
    kind, hook, prio, policy = m.groups()
    return f"{kind} {hook} {priority_value(prio)} {policy or 'accept'}"


def kernel_objects(text: str | None) -> KernelObjects | None:
    """Return the objects of a terse table listing (None when `text` is None: no table).

    `text` is `nft -t list table inet nodelb` output: objects start on lines indented by one
    tab (`chain NAME {`, `set NAME {`, `map NAME {`, `comment "..."`), and a base chain's
    `type ... hook ... priority ...;` line follows its `chain` line.
    """
    if text is None:
        return None
    comment = ""
    chains: dict[str, str] = {}
    sets: dict[str, str] = {}
    chain: str | None = None
    for line in text.splitlines():
        if line.startswith("\t\t"):
            if chain is not None and chains[chain] == "" and line.lstrip().startswith("type "):
                chains[chain] = listed_hook_spec(line)
            continue
        chain = None
        if not line.startswith("\t"):
            continue
        word, _, rest = line.strip().partition(" ")
        if word == "comment" and rest.startswith('"'):
            comment = rest.strip('"')
        elif word in ("chain", "set", "map") and rest.endswith("{"):
            name = rest[:-1].strip()
            if word == "chain":
                chains[name] = ""
                chain = name
            else:
                sets[name] = word
    return KernelObjects(comment, chains, sets)
