"""The netlink printer: typed element operations as one nf_tables netlink batch (pure).

Why: before every command, libnftables 1.0.6 dumps the chains and sets of *every* table in the
namespace (`NFT_MSG_GETCHAIN` and `NFT_MSG_GETSET` with no table filter, seen with strace and
`nft --debug=mnl`), whatever the command is. Next to kube-proxy's table at 10k Services
(~110k chains) that is ~0.7 s per transaction on the lab machine instead of ~0.3 ms. An element
delta needs none of that cache: this module encodes `Elements` ops (and flushes of sets and
maps) into NFT_MSG_NEWSETELEM / NFT_MSG_DELSETELEM messages inside one NFNL_MSG_BATCH_BEGIN ...
NFNL_MSG_BATCH_END batch (one atomic kernel transaction, as with nft). The socket that sends it
is agent/dataplane/netlink.py.

Keys and data are encoded from the ops' atoms as nft does (checked against `nft --debug=netlink`
and a kernel read-back): every field of a concatenation fills whole 4-byte registers; addresses
and ports in network byte order, the protocol in one byte; the backend index (`numgen random
mod 1` in the backend maps' `typeof`) is a 32-bit integer in host byte order, as numgen writes
it; verdicts as NFTA_DATA_VERDICT with the chain name for goto/jump; a concatenation with a
prefix (`srok`) as KEY (first values) and KEY_END (last values). Which field is which comes
from the set's layout (`set_shape`, by name: rules/layout.py); the `local` interval sets (nft
splits their ranges into start and end elements itself) and the affinity sets have none, so
ops on them keep going through libnftables (rules/text.py).

Flags match nft's: `add element` is NEWSETELEM with NLM_F_CREATE (an identical element that
exists is fine; the same key with other data is refused), `delete element` is DELSETELEM (a
missing element is refused with ENOENT), a flush is a DELSETELEM without elements. Every
message also carries NLM_F_ACK so that the sender knows the outcome of each.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from rules import layout as L
from rules.transaction import Atoms, Elements, Map, Op, Set, Transaction, Verb, Verdict

# include/uapi/linux/netlink.h, netfilter/nfnetlink.h, netfilter/nf_tables.h
NETLINK_NETFILTER = 12
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_CREATE = 0x400
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
NLM_F_DUMP = 0x300
NLA_F_NESTED = 0x8000
NETLINK_CAP_ACK = 10
SO_SNDBUFFORCE = 32  # asm-generic/socket.h
SOL_NETLINK = 270
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFNL_SUBSYS_NFTABLES = 10
NFNETLINK_V0 = 0
NFPROTO_UNSPEC = 0
NFPROTO_INET = 1
NFT_MSG_NEWSETELEM = 12
NFT_MSG_DELSETELEM = 14
NFTA_SET_ELEM_LIST_TABLE = 1
NFTA_SET_ELEM_LIST_SET = 2
NFTA_SET_ELEM_LIST_ELEMENTS = 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY = 1
NFTA_SET_ELEM_DATA = 2
NFTA_SET_ELEM_KEY_END = 10
NFTA_DATA_VALUE = 1
NFTA_DATA_VERDICT = 2
NFTA_VERDICT_CODE = 1
NFTA_VERDICT_CHAIN = 2

VERDICT_CODES: dict[str, int] = {
    "drop": 0,  # NF_DROP
    "accept": 1,  # NF_ACCEPT
    "continue": -1,  # NFT_CONTINUE
    "jump": -3,  # NFT_JUMP
    "goto": -4,  # NFT_GOTO
    "return": -5,  # NFT_RETURN
}
PROTOCOLS: dict[str, int] = {"tcp": 6, "udp": 17, "sctp": 132}

MAX_FAST_ELEMENTS = 1000
"""Transactions with more elements go through libnftables (`element_ops` returns None): they
are not the one-change case this path is for, and must stay under MAX_BATCH_BYTES."""

MAX_MESSAGE_BYTES = 60 * 1024
"""An op's elements are split into messages of at most this many bytes of elements: the
NFTA_SET_ELEM_LIST_ELEMENTS attribute's length is 16 bits (nft splits them the same way)."""

Field = Literal["addr", "proto", "port", "index", "net"]


class Unsupported(ValueError):
    """An element op the encoder does not express (the caller uses libnftables instead)."""


Data = bytes | Verdict


@dataclass(frozen=True, slots=True)
class Element:
    """One encoded set element: `key`; `key_end` for a concatenated range (the `srok` sets:
    the last value of every field, the key holding the first); `data` None for a set element
    and for every deletion (deleted by key), encoded bytes for a data map, a Verdict for a
    verdict map."""

    key: bytes
    data: Data | None = None
    key_end: bytes | None = None


@dataclass(frozen=True, slots=True)
class ElementOp:
    """One element op, encoded: `add`, `delete` or `flush` on the nodelb set `set_name`, with
    its elements' keys as the kernel stores them (none for a flush)."""

    verb: Verb
    set_name: str
    elements: tuple[Element, ...]


# -- field encoders (pure) -------------------------------------------------------------------


def _pad(raw: bytes) -> bytes:
    """Return `raw` padded with zeros to whole 4-byte registers (nft's concatenation layout)."""
    return raw + b"\0" * (-len(raw) % 4)


def encode_field(kind: Field, text: str, family: int) -> bytes:
    """Return the register bytes of one concatenation field as nft stores it.

    `addr`: 4 or 16 bytes, network order (`net`: a prefix, encoded as its first address;
    see `encode_range` for its last); `proto`: one byte (tcp/udp/sctp or a number)
    padded to 4; `port`: 2 bytes network order padded to 4; `index`: a 32-bit integer in host
    byte order (numgen's output). Raises Unsupported for text that does not parse.
    """
    try:
        if kind == "net":
            return _network(text, family).network_address.packed
        if kind == "addr":
            addr = ipaddress.ip_address(text)
            if addr.version != family:
                raise Unsupported(f"address {text} is not IPv{family}")
            return addr.packed
        if kind == "proto":
            value = PROTOCOLS[text] if text in PROTOCOLS else int(text)
            return _pad(struct.pack("B", value))
        if kind == "port":
            return _pad(struct.pack("!H", int(text)))
        return struct.pack("=I", int(text))
    except (ValueError, KeyError, struct.error) as exc:
        raise Unsupported(f"cannot encode {kind} {text!r}: {exc}") from exc


def _network(text: str, family: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    net = ipaddress.ip_network(text)  # strict: host bits set is an error, as in nft
    if net.version != family:
        raise Unsupported(f"network {text} is not IPv{family}")
    return net


def encode_range(kinds: tuple[Field, ...], atoms: Atoms, family: int) -> tuple[bytes, bytes]:
    """Return (first, last) of a concatenated range key as nft sends them (KEY, KEY_END).

    Every field but a `net` is a single value (first == last); a `net` runs from its network
    address to its last address. Raises Unsupported for atoms that do not parse.
    """
    if len(atoms) != len(kinds):
        raise Unsupported(f"{' . '.join(atoms)!r} does not have the fields {' . '.join(kinds)}")
    parts = atoms
    first = b"".join(encode_field(k, p, family) for k, p in zip(kinds, parts, strict=True))
    last = b""
    for k, p in zip(kinds, parts, strict=True):
        if k == "net":
            try:
                last += _network(p, family).broadcast_address.packed
            except ValueError as exc:
                raise Unsupported(f"cannot encode net {p!r}: {exc}") from exc
        else:
            last += encode_field(k, p, family)
    return first, last


_K: tuple[Field, ...] = ("addr", "proto", "port")


@dataclass(frozen=True, slots=True)
class SetShape:
    """How the elements of one nodelb set are laid out: key fields, and the kind of data."""

    family: int
    key: tuple[Field, ...]
    data: tuple[Field, ...] | Literal["verdict"] | None = None
    ranges: bool = False  # a concatenation with a range field: KEY and KEY_END


def set_shape(name: str) -> SetShape | None:
    """Return the element layout of the nodelb set or map `name`, None if not encodable.

    None for the `local` interval sets (nft turns their ranges into start and end elements
    and merges them itself) and the affinity sets, and for names the layout does not define
    (see rules/layout.py and docs/dataplane.md). `srok` is a concatenation with a range
    field, which the kernel takes as one element with KEY and KEY_END.
    """
    for fam in (4, 6):
        if name in (L.named(L.EXT, fam), L.named(L.INT, fam)):
            return SetShape(fam, _K, "verdict")
        if name in (L.named(L.NOEP, fam), L.named(L.DROP, fam), L.named(L.SRFE, fam)):
            return SetShape(fam, _K)
        if name == L.named(L.HELD, fam):
            return SetShape(fam, ("addr",))
        if name == L.named(L.SROK, fam):
            return SetShape(fam, (*_K, "net"), ranges=True)
        if name == L.named(L.HAIRPIN, fam):
            return SetShape(fam, (*_K, "addr"))
    head, sep, n = name.partition("_")
    if sep and n.isdigit() and head[:-1] in L.BACKEND_MAPS and head[-1:] in ("4", "6"):
        return SetShape(int(head[-1]), (*_K, "index"), ("addr", "port"))
    return None


def _concat(fields: tuple[Field, ...], atoms: Atoms, family: int) -> bytes:
    if len(atoms) != len(fields):
        raise Unsupported(f"{' . '.join(atoms)!r} does not have the fields {' . '.join(fields)}")
    return b"".join([encode_field(f, a, family) for f, a in zip(fields, atoms, strict=True)])


def encode_op(op: Op) -> ElementOp:
    """Return the encoded form of an `add` or `delete` Elements op. Raises Unsupported for any
    other op (a flush is a full sync's, see `encode_flush`), a set without a known layout, or
    an element that does not fit its set's layout (wrong family, field count, protocol, port,
    value)."""
    obj = op.obj
    if not isinstance(obj, Elements) or op.verb == "flush":
        raise Unsupported(f"not an element op: {op.text()[:80]}")
    shape = set_shape(obj.set)
    if shape is None:
        raise Unsupported(f"set {obj.set} is not encoded by the fast path")
    elements: list[Element] = []
    add = op.verb == "add"
    for key_atoms, value in obj.items:
        key_end: bytes | None = None
        if shape.ranges:
            key, key_end = encode_range(shape.key, key_atoms, shape.family)
        else:
            key = _concat(shape.key, key_atoms, shape.family)
        data: Data | None = None
        if add:
            if shape.data is None:
                if value is not None:
                    raise Unsupported(f"{obj.set} is a set, not a map")
            elif value is None:
                raise Unsupported(f"{obj.set} is a map: element {key_atoms!r} has no value")
            elif shape.data == "verdict":
                if not isinstance(value, Verdict):
                    raise Unsupported(f"{obj.set} maps to verdicts, not {value!r}")
                data = value
            else:
                if isinstance(value, Verdict):
                    raise Unsupported(f"{obj.set} maps to data, not the verdict {value.text()}")
                data = _concat(shape.data, value, shape.family)
        elements.append(Element(key, data, key_end))
    return ElementOp(op.verb, obj.set, tuple(elements))


def encode_flush(op: Op) -> ElementOp:
    """Return the encoded flush of a set or map the encoder knows (a DELSETELEM without
    elements). Raises Unsupported for anything else."""
    obj = op.obj
    if op.verb != "flush" or not isinstance(obj, Set | Map) or set_shape(obj.name) is None:
        raise Unsupported(f"cannot flush over netlink: {op.text()[:80]}")
    return ElementOp("flush", obj.name, ())


def element_ops(tx: Transaction) -> list[ElementOp] | None:
    """Return `tx` encoded when it holds only encodable element ops, else None.

    None also for an empty transaction and for more than MAX_FAST_ELEMENTS elements. Anything
    else (chains, maps, interval or affinity sets) means the transaction must go through
    libnftables.
    """
    if not tx.ops:
        return None
    if sum(len(op.obj.items) for op in tx.ops if isinstance(op.obj, Elements)) > MAX_FAST_ELEMENTS:
        return None
    try:
        return [encode_op(op) for op in tx.ops]
    except Unsupported:
        return None


@dataclass(frozen=True, slots=True)
class FullSplit:
    """A full in-place transaction cut in three for the fast path (see `split_full`)."""

    structure: Transaction  # libnftables: objects, rules, and the sets it must fill itself
    elements: tuple[Op, ...]  # netlink, one batch: flushes and element additions
    cleanup: Transaction  # libnftables: the objects nothing uses any more (may be empty)


def split_full(tx: Transaction) -> FullSplit | None:
    """Cut a full in-place transaction (rules/render.render) so that its elements can go as
    one netlink batch; None for the table-replacing shape, or when no element is encodable.

    The in-place shape is: the table's objects and rules (with flushes of what exists), then
    the elements, then the flushes and deletions of stale objects. Sent as three batches in
    that order, every state in between is one a packet may see safely: after the first, the
    old elements are still there and every chain they name still exists (new objects are
    only added; chains are rewritten with what their names say); the second replaces the
    content of every encodable set at once (flush + add in one batch); the third removes
    objects no element names any more. Sets the encoder does not know (`local` intervals)
    keep their flush and elements in the first batch.
    """
    structure: list[Op] = []
    elements: list[Op] = []
    cleanup: list[Op] = []
    seen_elements = False
    for op in tx.ops:
        kind, name = op.target()
        if kind == "table" and op.verb == "delete":
            return None  # the replacing shape: one libnftables batch
        encodable = set_shape(name) is not None
        if kind == "element":
            seen_elements = True
            (elements if encodable else structure).append(op)
        elif seen_elements:
            cleanup.append(op)
        elif op.verb == "flush" and kind in ("set", "map") and encodable:
            elements.append(op)
        else:
            structure.append(op)
    if not any(isinstance(op.obj, Elements) for op in elements):
        return None
    flushes = [op for op in elements if op.verb == "flush"]
    adds = [op for op in elements if op.verb != "flush"]
    return FullSplit(Transaction(tuple(structure)), (*flushes, *adds), Transaction(tuple(cleanup)))


class ElementBatch:
    """Element ops as the applier hands them to an ElementSender: the typed ops (a fake
    applies these) and their encoded form (`encoded` when given, else encoded from `ops` one
    op at a time while iterating, so a full table's 100k elements are never all encoded at
    once; raises Unsupported)."""

    def __init__(self, ops: Sequence[Op], encoded: Sequence[ElementOp] | None = None) -> None:
        self.ops = tuple(ops)
        self._encoded = encoded

    def __iter__(self) -> Iterator[ElementOp]:
        if self._encoded is not None:
            return iter(self._encoded)
        return (encode_flush(op) if op.verb == "flush" else encode_op(op) for op in self.ops)

    def text(self) -> str:
        """Return the batch as nft input (fakes, logs)."""
        return Transaction(self.ops).text()


# -- netlink encoding (pure) -----------------------------------------------------------------


def nla(kind: int, payload: bytes, *, nested: bool = False) -> bytes:
    """Return one netlink attribute: header (length, type), payload, padding to 4 bytes."""
    header = struct.pack("=HH", 4 + len(payload), kind | (NLA_F_NESTED if nested else 0))
    return _pad(header + payload)


def _data(payload: Data) -> bytes:
    if isinstance(payload, Verdict):
        inner = nla(NFTA_VERDICT_CODE, struct.pack("!i", VERDICT_CODES[payload.kind]))
        if payload.chain is not None:
            inner += nla(NFTA_VERDICT_CHAIN, payload.chain.encode() + b"\0")
        return nla(NFTA_DATA_VERDICT, inner, nested=True)
    return nla(NFTA_DATA_VALUE, payload)


def encode_element(element: Element) -> bytes:
    """Return one NFTA_LIST_ELEM: NFTA_SET_ELEM_KEY, then NFTA_SET_ELEM_DATA for a map or
    NFTA_SET_ELEM_KEY_END for a range (the order nft 1.0.6 sends them in)."""
    body = nla(NFTA_SET_ELEM_KEY, nla(NFTA_DATA_VALUE, element.key), nested=True)
    if element.data is not None:
        body += nla(NFTA_SET_ELEM_DATA, _data(element.data), nested=True)
    if element.key_end is not None:
        body += nla(NFTA_SET_ELEM_KEY_END, nla(NFTA_DATA_VALUE, element.key_end), nested=True)
    return nla(NFTA_LIST_ELEM, body, nested=True)


def message(
    msg_type: int, flags: int, seq: int, *, family: int, res_id: int, attrs: bytes
) -> bytes:
    nfgen = struct.pack("=BB", family, NFNETLINK_V0) + struct.pack("!H", res_id)
    return struct.pack("=IHHII", 16 + len(nfgen) + len(attrs), msg_type, flags, seq, 0) + (
        nfgen + attrs
    )


def encode_message(op: ElementOp, seq: int, elements: bytes | None = None) -> bytes:
    """Return the NEWSETELEM/DELSETELEM message of `op` (family inet, table nodelb).

    `elements`, when given, are some of the op's elements already encoded (one message of a
    split op). A flush is a DELSETELEM without elements: the kernel empties the set.
    """
    attrs = nla(NFTA_SET_ELEM_LIST_TABLE, L.TABLE_NAME.encode() + b"\0")
    attrs += nla(NFTA_SET_ELEM_LIST_SET, op.set_name.encode() + b"\0")
    if op.verb != "flush":
        elems = elements if elements is not None else b"".join(map(encode_element, op.elements))
        attrs += nla(NFTA_SET_ELEM_LIST_ELEMENTS, elems, nested=True)
    if op.verb == "add":
        kind, flags = NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK
    else:
        kind, flags = NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK
    return message(
        (NFNL_SUBSYS_NFTABLES << 8) | kind, flags, seq, family=NFPROTO_INET, res_id=0, attrs=attrs
    )


@dataclass(frozen=True, slots=True)
class Batch:
    """An encoded batch: its bytes and the sequence numbers the kernel must acknowledge."""

    data: bytes
    begin_seq: int
    acked: tuple[int, ...]


def _chunks(op: ElementOp) -> Iterator[bytes | None]:
    """Yield the op's encoded elements in pieces of at most MAX_MESSAGE_BYTES (None: a flush,
    one message without elements)."""
    if op.verb == "flush":
        yield None
        return
    piece: list[bytes] = []
    size = 0
    for element in op.elements:
        raw = encode_element(element)
        if piece and size + len(raw) > MAX_MESSAGE_BYTES:
            yield b"".join(piece)
            piece, size = [], 0
        piece.append(raw)
        size += len(raw)
    yield b"".join(piece)


def encode_batch(ops: Iterable[ElementOp], seq: int) -> Batch:
    """Return BATCH_BEGIN, the messages of every op (sequence numbers seq+1 ...), BATCH_END.

    An op with more than MAX_MESSAGE_BYTES of elements takes several messages. `ops` is read
    once, so a generator keeps only one op's parsed elements alive at a time.
    """
    res = NFNL_SUBSYS_NFTABLES
    parts = [
        message(
            NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, family=NFPROTO_UNSPEC, res_id=res, attrs=b""
        )
    ]
    acked: list[int] = []
    for op in ops:
        for piece in _chunks(op):
            acked.append(seq + len(acked) + 1)
            parts.append(encode_message(op, acked[-1], piece))
    end_seq = seq + len(acked) + 1
    parts.append(
        message(
            NFNL_MSG_BATCH_END, NLM_F_REQUEST, end_seq, family=NFPROTO_UNSPEC, res_id=res, attrs=b""
        )
    )
    return Batch(b"".join(parts), seq, tuple(acked))


class DecodeError(ValueError):
    """Netlink data that does not decode: a truncated message or attribute."""


@dataclass(frozen=True, slots=True)
class Message:
    """One netlink message: its header fields and its body (after the 16-byte header)."""

    type: int
    flags: int
    seq: int
    portid: int
    body: bytes


def messages(data: bytes) -> Iterator[Message]:
    """Yield the netlink messages in one datagram, in order.

    Raises DecodeError on a truncated message and on trailing bytes after the last one (the
    last message may lack its padding).
    """
    off = 0
    while off + 16 <= len(data):
        length, kind, flags, seq, portid = struct.unpack_from("=IHHII", data, off)
        if length < 16 or off + length > len(data):
            raise DecodeError(f"truncated netlink message at {off}: length {length}")
        yield Message(kind, flags, seq, portid, data[off + 16 : off + length])
        off += min((length + 3) & ~3, len(data) - off)
    if off != len(data):
        raise DecodeError(f"{len(data) - off} trailing bytes after the last netlink message")


def attribute_list(data: bytes, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """Yield (type, payload) of each attribute in `data` from `offset`, in order (the nested
    and byte-order flags masked off). Raises DecodeError on a truncated attribute."""
    off = offset
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        if length < 4 or off + length > len(data):
            raise DecodeError(f"truncated attribute at {off}: length {length}")
        yield kind & 0x3FFF, data[off + 4 : off + length]
        off += (length + 3) & ~3


def attributes(data: bytes, offset: int = 0) -> dict[int, bytes]:
    """Return the attributes in `data` from `offset` by type (the last of a type wins)."""
    return dict(attribute_list(data, offset))


def error_code(message: Message) -> int:
    """Return the errno an NLMSG_ERROR or NLMSG_DONE message carries (0: an ack, or done).
    Raises DecodeError when an NLMSG_ERROR is too short to carry one."""
    if len(message.body) < 4:
        if message.type == NLMSG_ERROR:
            raise DecodeError("truncated NLMSG_ERROR")
        return 0
    return -int(struct.unpack_from("=i", message.body, 0)[0])


def decode_acks(data: bytes) -> list[tuple[int, int]]:
    """Return (sequence number, errno) of every NLMSG_ERROR message in `data` (0 = ack).

    Other message types are skipped. Raises DecodeError (a ValueError) on a truncated message.
    """
    return [(m.seq, error_code(m)) for m in messages(data) if m.type == NLMSG_ERROR]


def ops_summary(ops: Iterable[ElementOp]) -> str:
    """Return a short description of `ops` for logs: `add be4_3 x2, delete ext4 x1`."""
    return ", ".join(f"{o.verb} {o.set_name} x{len(o.elements)}" for o in ops)
