"""Read the nodelb table back over netlink (nf_tables dumps), for the drift check.

Why not `nft -j list table`: libnftables builds its cache of every element first and keeps it
while it prints, so one read-back of a 10k Services x 10 endpoints table cost ~4 s and took
the agent's RSS from ~160 MB to ~480 MB (bench/memory.py, drift-check phase). Dumps of the
table's chains, rules, sets and elements cost a few MB, and each element is decoded into the
canonical text rules/readback.py compares (`Snapshot`), so the comparison and its messages
stay the same as with the JSON read-back.

What is read: the table's presence (GETTABLE), its chains (GETCHAIN), the number of rules of
each (GETRULE, filtered by table), its named sets and maps (GETSET; the anonymous sets rules
create are not listed by nft either) and their elements (GETSETELEM, one dump per set).
Elements are decoded by the layout the encoder knows (agent/dataplane/netlink.py `set_shape`); the
`local` interval sets are read as the kernel keeps them (a start element, and an end element
one past the last address, flagged NFT_SET_ELEM_INTERVAL_END) and written back as prefixes;
session-affinity sets are listed without elements (the kernel fills them). A set of any other
name is listed without elements: it is a difference anyway.

The objects a full render must know of an existing table (`read_objects`: the comment from
the table's user data, each chain's hook, type, priority and policy, each set's kind) come
from the same dumps, without a single element: `nft -t list table` fetched every element
first (~3.7 s and ~200 MB at 10k Services, on every agent start).

Decoding is pure (`decode_*`, `chain_spec`, `table_comment`); `read_snapshot` and
`read_objects` drive a `Dumper` (NetlinkElementSender.dump); `NetlinkTableReader` is what the
Dataplane is given.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

from agent.dataplane.libnft import NftError
from rules import layout as L
from rules.netlink import (
    NFTA_DATA_VALUE,
    NFTA_DATA_VERDICT,
    NFTA_LIST_ELEM,
    NFTA_SET_ELEM_DATA,
    NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_KEY_END,
    NFTA_SET_ELEM_LIST_ELEMENTS,
    NFTA_SET_ELEM_LIST_SET,
    NFTA_SET_ELEM_LIST_TABLE,
    NFTA_VERDICT_CHAIN,
    NFTA_VERDICT_CODE,
    PROTOCOLS,
    VERDICT_CODES,
    DecodeError,
    Field,
    SetShape,
    attribute_list,
    attributes,
    nla,
    set_shape,
)
from rules.readback import Snapshot
from rules.render import KernelObjects

# include/uapi/linux/netfilter/nf_tables.h
NFT_MSG_GETTABLE = 1
NFT_MSG_GETCHAIN = 4
NFT_MSG_GETRULE = 7
NFT_MSG_GETSET = 10
NFT_MSG_GETSETELEM = 13
NFTA_TABLE_NAME = 1
NFTA_TABLE_USERDATA = 6
NFTNL_UDATA_TABLE_COMMENT = 0  # libnftnl's user-data TLV for a table comment
NFTA_CHAIN_TABLE = 1
NFTA_CHAIN_NAME = 3
NFTA_CHAIN_HOOK = 4
NFTA_CHAIN_POLICY = 5
NFTA_CHAIN_TYPE = 7
NFTA_HOOK_HOOKNUM = 1
NFTA_HOOK_PRIORITY = 2
NFTA_RULE_TABLE = 1
NFTA_RULE_CHAIN = 2
NFTA_RULE_EXPRESSIONS = 4
NFTA_SET_TABLE = 1
NFTA_SET_NAME = 2
NFTA_SET_FLAGS = 3
NFTA_SET_ELEM_FLAGS = 3
NFT_SET_ANONYMOUS = 0x1
NFT_SET_MAP = 0x8
NFT_SET_ELEM_INTERVAL_END = 0x1

T = TypeVar("T")
_PROTO_NAMES = {number: name for name, number in PROTOCOLS.items()}
_VERDICT_NAMES = {code: name for name, code in VERDICT_CODES.items()}
_FIELD_SIZE = {"proto": 4, "port": 4, "index": 4}
_HOOKS = {0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting", 5: "ingress"}
_POLICIES = {0: "drop", 1: "accept"}


class Dumper(Protocol):
    """Runs one nf_tables dump request and returns every reply's nfgenmsg + attributes."""

    def dump(self, msg_type: int, attrs: bytes) -> list[bytes]: ...


# -- attributes ------------------------------------------------------------------------------


def _string(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode()


def _message_attrs(body: bytes) -> dict[int, bytes]:
    """Return the attributes of one reply (after its 4-byte nfgenmsg)."""
    return attributes(body, 4)


# -- elements --------------------------------------------------------------------------------


def _fields(shape_fields: tuple[Field, ...], raw: bytes, family: int) -> list[str]:
    """Split a concatenation's registers back into canonical atoms."""
    out: list[str] = []
    off = 0
    for kind in shape_fields:
        size = (4 if family == 4 else 16) if kind in ("addr", "net") else _FIELD_SIZE[kind]
        part = raw[off : off + size]
        if len(part) != size:
            raise DecodeError(f"{len(raw)}-byte key is too short for {shape_fields}")
        off += size
        if kind in ("addr", "net"):
            out.append(str(ipaddress.ip_address(part)))
        elif kind == "proto":
            out.append(_PROTO_NAMES.get(part[0], str(part[0])))
        elif kind == "port":
            out.append(str(struct.unpack("!H", part[:2])[0]))
        else:
            out.append(str(struct.unpack("=I", part)[0]))
    if off != len(raw):
        raise DecodeError(f"{len(raw)}-byte key is too long for {shape_fields}")
    return out


def _prefix(first: str, last: str, family: int) -> str:
    """Return the canonical text of the range first..last (a prefix, or a plain address)."""
    lo, hi = int(ipaddress.ip_address(first)), int(ipaddress.ip_address(last))
    nets = _networks(lo, hi, family) if lo <= hi else []
    return nets[0] if len(nets) == 1 else f"{first}-{last}"


def _verdict(raw: bytes) -> str:
    attrs = attributes(raw)
    code = struct.unpack("!i", attrs[NFTA_VERDICT_CODE])[0]
    name = _VERDICT_NAMES.get(code, str(code))
    if NFTA_VERDICT_CHAIN in attrs:
        return f"{name} {_string(attrs[NFTA_VERDICT_CHAIN])}"
    return name


def decode_element(shape: SetShape, elem: bytes) -> str:
    """Return the canonical text (rules/readback.py) of one NFTA_LIST_ELEM's payload."""
    attrs = attributes(elem)
    key = attributes(attrs[NFTA_SET_ELEM_KEY])[NFTA_DATA_VALUE]
    atoms = _fields(shape.key, key, shape.family)
    if shape.ranges:
        end = attributes(attrs[NFTA_SET_ELEM_KEY_END])[NFTA_DATA_VALUE]
        last = _fields(shape.key, end, shape.family)
        atoms = [
            _prefix(a, b, shape.family) if kind == "net" else a
            for kind, a, b in zip(shape.key, atoms, last, strict=True)
        ]
    text = " . ".join(atoms)
    if shape.data is None or NFTA_SET_ELEM_DATA not in attrs:
        return text
    data = attributes(attrs[NFTA_SET_ELEM_DATA])
    if shape.data == "verdict":
        return f"{text} : {_verdict(data[NFTA_DATA_VERDICT])}"
    return f"{text} : {' . '.join(_fields(shape.data, data[NFTA_DATA_VALUE], shape.family))}"


def _interval_bound(elem: bytes) -> tuple[bytes, bool]:
    attrs = attributes(elem)
    key = attributes(attrs[NFTA_SET_ELEM_KEY])[NFTA_DATA_VALUE]
    flags = struct.unpack("!I", attrs.get(NFTA_SET_ELEM_FLAGS, b"\0\0\0\0"))[0]
    return key, bool(flags & NFT_SET_ELEM_INTERVAL_END)


def decode_intervals(elems: Iterable[bytes], family: int) -> frozenset[str]:
    """Return the prefixes of an interval set from its start and end elements.

    The kernel keeps [start, end) with `end` flagged INTERVAL_END (none when the range runs
    to the last address); nft may add an end element at the very first address.
    """
    size = 4 if family == 4 else 16
    bounds = sorted((_interval_bound(e) for e in elems), key=lambda b: (b[0], not b[1]))
    top = int.from_bytes(b"\xff" * size, "big")
    out: set[str] = set()
    start: int | None = None
    for key, is_end in bounds:
        value = int.from_bytes(key, "big")
        if is_end:
            if start is not None:
                out.update(_networks(start, value - 1, family))
                start = None
        else:
            if start is not None:  # two starts in a row: the first ran to the next one
                out.update(_networks(start, value - 1, family))
            start = value
    if start is not None:
        out.update(_networks(start, top, family))
    return frozenset(out)


def _networks(lo: int, hi: int, family: int) -> list[str]:
    make = ipaddress.IPv4Address if family == 4 else ipaddress.IPv6Address
    return [
        str(n.network_address) if n.prefixlen == n.max_prefixlen else n.with_prefixlen
        for n in ipaddress.summarize_address_range(make(lo), make(hi))
    ]


def elements_of(replies: Iterable[bytes]) -> Iterator[bytes]:
    """Yield the NFTA_LIST_ELEM payloads of GETSETELEM replies."""
    for body in replies:
        attrs = _message_attrs(body)
        for kind, elem in attribute_list(attrs.get(NFTA_SET_ELEM_LIST_ELEMENTS, b"")):
            if kind == NFTA_LIST_ELEM:
                yield elem


# -- the table -------------------------------------------------------------------------------


def _table_filter(kind: int) -> bytes:
    return nla(kind, L.TABLE_NAME.encode() + b"\0")


def table_comment(userdata: bytes) -> str:
    """Return the comment in a table's user data (libnftnl TLVs: type, length, value)."""
    off = 0
    while off + 2 <= len(userdata):
        kind, length = userdata[off], userdata[off + 1]
        if kind == NFTNL_UDATA_TABLE_COMMENT:
            return _string(userdata[off + 2 : off + 2 + length])
        off += 2 + length
    return ""


def chain_spec(attrs: dict[int, bytes]) -> str:
    """Return a chain's hook as rules.render.hook_spec writes it ("" for a regular chain)."""
    if NFTA_CHAIN_HOOK not in attrs:
        return ""
    hook = attributes(attrs[NFTA_CHAIN_HOOK])
    num = struct.unpack("!I", hook[NFTA_HOOK_HOOKNUM])[0]
    prio = struct.unpack("!i", hook[NFTA_HOOK_PRIORITY])[0]
    policy = struct.unpack("!I", attrs.get(NFTA_CHAIN_POLICY, b"\0\0\0\1"))[0]
    kind = _string(attrs.get(NFTA_CHAIN_TYPE, b"filter"))
    return f"{kind} {_HOOKS.get(num, str(num))} {prio} {_POLICIES.get(policy, str(policy))}"


def read_objects(dumper: Dumper) -> KernelObjects | None:
    """Return what a full render must know of the table (rules.render.KernelObjects: its
    comment, chains with their hooks, named sets and maps), None when there is no table: what
    `nft -t list table` gives, without fetching a single element."""
    comment: str | None = None
    for body in dumper.dump(NFT_MSG_GETTABLE, b""):
        attrs = _message_attrs(body)
        if _string(attrs.get(NFTA_TABLE_NAME, b"")) == L.TABLE_NAME:
            comment = table_comment(attrs.get(NFTA_TABLE_USERDATA, b""))
    if comment is None:
        return None
    chains: dict[str, str] = {}
    for body in dumper.dump(NFT_MSG_GETCHAIN, b""):
        attrs = _message_attrs(body)
        if _string(attrs.get(NFTA_CHAIN_TABLE, b"")) == L.TABLE_NAME:
            chains[_string(attrs[NFTA_CHAIN_NAME])] = chain_spec(attrs)
    sets: dict[str, str] = {}
    for body in dumper.dump(NFT_MSG_GETSET, _table_filter(NFTA_SET_TABLE)):
        attrs = _message_attrs(body)
        flags = struct.unpack("!I", attrs.get(NFTA_SET_FLAGS, b"\0\0\0\0"))[0]
        if not flags & NFT_SET_ANONYMOUS:
            sets[_string(attrs[NFTA_SET_NAME])] = "map" if flags & NFT_SET_MAP else "set"
    return KernelObjects(comment, chains, sets)


def read_snapshot(dumper: Dumper) -> Snapshot:
    """Return the Snapshot of the nodelb table as the kernel holds it (ABSENT if none).

    Raises NftError (from the dumper) or DecodeError.
    """
    objects = read_objects(dumper)
    if objects is None:
        return Snapshot(present=False)
    chains = dict.fromkeys(objects.chains, 0)
    for body in dumper.dump(NFT_MSG_GETRULE, _table_filter(NFTA_RULE_TABLE)):
        name = _string(_message_attrs(body)[NFTA_RULE_CHAIN])
        chains[name] = chains.get(name, 0) + 1
    sets: dict[str, frozenset[str]] = dict.fromkeys(objects.sets, frozenset())
    for name in sets:
        shape = set_shape(name)
        local_family = next((f for f in (4, 6) if name == L.named(L.LOCAL, f)), None)
        if shape is None and local_family is None:
            continue  # affinity sets (run-time content) and names the layout does not know
        request = _table_filter(NFTA_SET_ELEM_LIST_TABLE) + nla(
            NFTA_SET_ELEM_LIST_SET, name.encode() + b"\0"
        )
        elems = elements_of(dumper.dump(NFT_MSG_GETSETELEM, request))
        if shape is not None:
            sets[name] = frozenset(decode_element(shape, e) for e in elems)
        else:
            assert local_family is not None
            sets[name] = decode_intervals(elems, local_family)
    return Snapshot(present=True, sets=sets, chains=chains)


_ANONYMOUS_SET = re.compile(rb"__set\d+\x00")


def rule_print(expressions: bytes) -> str:
    """Return a fingerprint of a rule's expressions as the kernel holds them.

    The rule's handle and position are other attributes and do not count; the names the
    kernel gives anonymous sets (`__set0`, `__set7`) change whenever a table is rewritten and
    are blanked. Two rules print the same exactly when they do the same.
    """
    return hashlib.blake2b(_ANONYMOUS_SET.sub(b"__set\x00", expressions), digest_size=8).hexdigest()


def read_rule_prints(dumper: Dumper) -> dict[str, tuple[str, ...]]:
    """Return every chain's rules as fingerprints (`rule_print`), in order, by chain name
    (chains without rules are absent). Raises NftError (from the dumper) or DecodeError."""
    out: dict[str, list[str]] = {}
    for body in dumper.dump(NFT_MSG_GETRULE, _table_filter(NFTA_RULE_TABLE)):
        attrs = _message_attrs(body)
        name = _string(attrs[NFTA_RULE_CHAIN])
        out.setdefault(name, []).append(rule_print(attrs.get(NFTA_RULE_EXPRESSIONS, b"")))
    return {name: tuple(prints) for name, prints in out.items()}


class NetlinkTableReader:
    """Reads the nodelb table over one netlink socket (the Dataplane's `readback`); a reply
    it cannot decode raises NftError, like a dump the kernel refuses."""

    def __init__(self, dumper: Dumper) -> None:
        self._dumper = dumper

    def snapshot(self) -> Snapshot:
        """Return the table's content for the drift check (see `read_snapshot`)."""
        return self._decoded(read_snapshot)

    def objects(self) -> KernelObjects | None:
        """Return the table's objects for a full render (see `read_objects`)."""
        return self._decoded(read_objects)

    def rule_prints(self) -> dict[str, tuple[str, ...]]:
        """Return every chain's rule fingerprints (see `read_rule_prints`)."""
        return self._decoded(read_rule_prints)

    def _decoded(self, read: Callable[[Dumper], T]) -> T:
        try:
            return read(self._dumper)
        except (DecodeError, KeyError, struct.error) as exc:
            raise NftError(f"cannot decode the nodelb table read over netlink: {exc!r}") from exc
