"""The netlink printer (rules/netlink.py) and the applier's use of a sender, without root.

Golden bytes come from `nft --debug=mnl -f` (nftables 1.0.6) adding the same elements to a
nodelb table in a lab namespace: the attribute trees below are what nft sent, minus the
NFTA_SET_ELEM_LIST_SET_ID attribute nft adds (the kernel looks the set up by name first).
tests/kernel/test_nftnl_kernel.py checks the same encodings against a kernel read-back.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroute2.netlink.nfnetlink.nftsocket import nft_set_elem_list_msg

from agent.dataplane.applier import Dataplane, SyncMode, SyncOutcome
from agent.dataplane.libnft import NftError
from agent.model.desired_state import DesiredState
from rules import netlink as nftnl
from rules.delta import delta
from rules.netlink import Element, ElementOp, Unsupported
from rules.render import render
from rules.transaction import Atoms, Chain, Elements, Item, Map, Op, Transaction, Verdict
from tests.unit.rules_states import desired_states, eps, fe, state
from tests.unit.test_applier import A, B, FakeRunner, make

HOST_1 = (1).to_bytes(4, sys.byteorder)  # numgen writes its register in host order


def E(name: str, *items: Item) -> Elements:
    """Return the elements `items` of set or map `name`."""
    return Elements(name, items)


def k(text: str) -> Atoms:
    """Return the atoms of a key or value written as nft writes it (`a . b . c`)."""
    return tuple(text.split(" . "))


def goto(chain: str) -> Verdict:
    return Verdict("goto", chain)


ACCEPT = Verdict("accept")

# What nft 1.0.6 sent for `add element inet nodelb be4_10 { 198.18.200.1 . tcp . 80 . 3 :
# 198.19.9.9 . 8080 }` (x86-64: attribute headers and the numgen index are little-endian).
BE4_LIST_ELEM = bytes.fromhex(
    "2c00 0180"  # NFTA_LIST_ELEM, nested, 44 bytes
    "1800 0180"  # NFTA_SET_ELEM_KEY, nested
    "1400 0100"  # NFTA_DATA_VALUE, 16 bytes of key
    "c612c801 06000000 00500000 03000000"  # addr . tcp . 80 . index 3
    "1000 0280"  # NFTA_SET_ELEM_DATA, nested
    "0c00 0100"  # NFTA_DATA_VALUE, 8 bytes
    "c6130909 1f900000"  # 198.19.9.9 . 8080
)
# `add element inet nodelb ext4 { 198.18.200.1 . udp . 53 : goto ep4_10 }`
EXT4_GOTO_LIST_ELEM = bytes.fromhex(
    "3400 0180"
    "1400 0180 1000 0100 c612c801 11000000 00350000"
    "1c00 0280"  # NFTA_SET_ELEM_DATA
    "1800 0280"  # NFTA_DATA_VERDICT, nested
    "0800 0100 fffffffc"  # NFTA_VERDICT_CODE NFT_GOTO (-4), big-endian
    "0b00 0200 6570345f 31300000"  # NFTA_VERDICT_CHAIN "ep4_10\0", padded
)
# `add element inet nodelb ext4 { 198.18.200.2 . sctp . 9 : accept }`
EXT4_ACCEPT_LIST_ELEM = bytes.fromhex(
    "2800 01801400 0180 1000 0100 c612c802 84000000 000900001000 0280 0c00 0280 0800 0100 00000001"
)
# `add element inet nodelb srok4 { 198.18.200.1 . tcp . 80 . 203.0.113.0/24 }`
SROK4_LIST_ELEM = bytes.fromhex(
    "3400 0180"
    "1800 0180 1400 0100 c612c801 06000000 00500000 cb007100"  # KEY: first values
    "1800 0a80 1400 0100 c612c801 06000000 00500000 cb0071ff"  # KEY_END (10): last values
)
# `add element inet nodelb hpi4 { 198.18.200.1 . tcp . 80 . 198.19.9.9 }`
HPI4_LIST_ELEM = bytes.fromhex(
    "1c00 0180"  # NFTA_LIST_ELEM, nested, 28 bytes
    "1800 0180 1400 0100"  # NFTA_SET_ELEM_KEY > NFTA_DATA_VALUE, 16 bytes
    "c612c801 06000000 00500000 c6130909"  # addr . tcp . 80 . source address
)
# `add element inet nodelb held4 { 198.18.200.1 }`
HELD4_LIST_ELEM = bytes.fromhex("1000 0180 0c00 0180 0800 0100 c612c801")


@pytest.mark.skipif(sys.byteorder != "little", reason="golden bytes captured on x86-64")
@pytest.mark.parametrize(
    ("obj", "golden"),
    [
        pytest.param(
            E("be4_10", (k("198.18.200.1 . tcp . 80 . 3"), k("198.19.9.9 . 8080"))),
            BE4_LIST_ELEM,
            id="a backend map element: concatenated key with a host-order index, concat data",
        ),
        pytest.param(
            E("ext4", (k("198.18.200.1 . udp . 53"), goto("ep4_10"))),
            EXT4_GOTO_LIST_ELEM,
            id="a verdict map element pointing at a dispatch chain",
        ),
        pytest.param(
            E("ext4", (k("198.18.200.2 . sctp . 9"), ACCEPT)),
            EXT4_ACCEPT_LIST_ELEM,
            id="a verdict map element with a plain accept verdict",
        ),
        pytest.param(
            E("srok4", (k("198.18.200.1 . tcp . 80 . 203.0.113.0/24"), None)),
            SROK4_LIST_ELEM,
            id="a source-range element: a concatenated range sent as KEY and KEY_END",
        ),
        pytest.param(
            E("hpi4", (k("198.18.200.1 . tcp . 80 . 198.19.9.9"), None)),
            HPI4_LIST_ELEM,
            id="a hairpin-source element: a frontend key and an address, no range",
        ),
        pytest.param(
            E("held4", (k("198.18.200.1"), None)),
            HELD4_LIST_ELEM,
            id="a plain address set element",
        ),
    ],
)
def test_elements_encode_exactly_as_nft_sends_them(obj: Elements, golden: bytes) -> None:
    op = nftnl.encode_op(Op("add", obj))
    assert len(op.elements) == 1
    assert nftnl.encode_element(op.elements[0]) == golden


def test_the_batch_is_begin_one_message_per_op_and_end() -> None:
    ops = [
        nftnl.encode_op(Op("delete", E("held4", (k("198.18.200.1"), None)))),
        nftnl.encode_op(Op("add", E("held4", (k("198.18.200.1"), None)))),
    ]
    batch = nftnl.encode_batch(ops, 7)
    assert batch.begin_seq == 7
    assert batch.acked == (8, 9)
    data = batch.data
    # BATCH_BEGIN: 20 bytes, type 0x10, NLM_F_REQUEST, seq 7, nfgenmsg res_id = htons(10).
    assert data[:20] == struct.pack("=IHHII", 20, 0x10, 1, 7, 0) + bytes([0, 0, 0, 10])
    assert data[-20:] == struct.pack("=IHHII", 20, 0x11, 1, 10, 0) + bytes([0, 0, 0, 10])
    off = 20
    seen = []
    while off < len(data) - 20:
        length, kind, flags, seq, _ = struct.unpack_from("=IHHII", data, off)
        family = data[off + 16]
        seen.append((kind, flags, seq, family))
        off += length
    assert off == len(data) - 20
    assert seen == [
        (0x0A0E, 0x1 | 0x4, 8, 1),  # DELSETELEM, REQUEST|ACK, family inet
        (0x0A0C, 0x1 | 0x4 | 0x400, 9, 1),  # NEWSETELEM, REQUEST|ACK|CREATE
    ]


def _pyroute2_elements(message: bytes) -> tuple[str, str, list[dict[str, object]]]:
    msg = nft_set_elem_list_msg(message)
    msg.decode()
    elems = msg.get_attr("NFTA_SET_ELEM_LIST_ELEMENTS")
    out = []
    for el in elems:
        key = el.get_attr("NFTA_SET_ELEM_KEY").get_attr("NFTA_DATA_VALUE")
        data = el.get_attr("NFTA_SET_ELEM_DATA")
        item: dict[str, object] = {"key": key}
        if data is not None:
            verdict = data.get_attr("NFTA_DATA_VERDICT")
            if verdict is not None:
                item["verdict"] = (
                    verdict.get_attr("NFTA_VERDICT_CODE"),
                    verdict.get_attr("NFTA_VERDICT_CHAIN"),
                )
            else:
                item["value"] = data.get_attr("NFTA_DATA_VALUE")
        out.append(item)
    return (
        msg.get_attr("NFTA_SET_ELEM_LIST_TABLE"),
        msg.get_attr("NFTA_SET_ELEM_LIST_SET"),
        out,
    )


def test_an_independent_decoder_reads_back_ipv6_keys_data_and_verdicts() -> None:
    tx = Transaction(
        (
            Op(
                "add",
                E(
                    "be6_2",
                    (k("2001:db8::200 . tcp . 443 . 1"), k("2001:db8:1::5 . 8443")),
                    (k("2001:db8::200 . tcp . 443 . 0"), k("2001:db8:1::6 . 8443")),
                ),
            ),
            Op(
                "add",
                E(
                    "int6",
                    (k("2001:db8::200 . udp . 53"), goto("epc6_2")),
                    (k("2001:db8::201 . udp . 53"), ACCEPT),
                ),
            ),
        )
    )
    ops = nftnl.element_ops(tx)
    assert ops is not None
    be, vmap = (nftnl.encode_message(op, 1) for op in ops)
    fe200 = bytes.fromhex("20010db8000000000000000000000200")
    fe201 = bytes.fromhex("20010db8000000000000000000000201")
    ep5 = bytes.fromhex("20010db8000100000000000000000005")
    ep6 = bytes.fromhex("20010db8000100000000000000000006")
    port = bytes([0x20, 0xFB, 0, 0])  # 8443, network order, padded
    assert _pyroute2_elements(be) == (
        "nodelb",
        "be6_2",
        [
            {
                "key": fe200 + bytes([6, 0, 0, 0, 1, 0xBB, 0, 0]) + (1).to_bytes(4, sys.byteorder),
                "value": ep5 + port,
            },
            {
                "key": fe200 + bytes([6, 0, 0, 0, 1, 0xBB, 0, 0]) + (0).to_bytes(4, sys.byteorder),
                "value": ep6 + port,
            },
        ],
    )
    assert _pyroute2_elements(vmap) == (
        "nodelb",
        "int6",
        [
            {"key": fe200 + bytes([17, 0, 0, 0, 0, 53, 0, 0]), "verdict": ("NFT_GOTO", "epc6_2")},
            {"key": fe201 + bytes([17, 0, 0, 0, 0, 53, 0, 0]), "verdict": ("NF_ACCEPT", None)},
        ],
    )


def test_deletions_carry_keys_only() -> None:
    op = nftnl.encode_op(Op("delete", E("be4_2", (k("198.18.0.200 . tcp . 80 . 1"), None))))
    key = bytes([198, 18, 0, 200, 6, 0, 0, 0, 0, 80, 0, 0]) + HOST_1
    assert op == ElementOp("delete", "be4_2", (Element(key),))
    _, _, items = _pyroute2_elements(nftnl.encode_message(op, 1))
    assert items == [{"key": key}]


def test_an_ipv6_source_range_runs_from_its_first_to_its_last_address() -> None:
    op = nftnl.encode_op(
        Op("delete", E("srok6", (k("2001:db8::1 . udp . 53 . 2001:db8:ffff::/48"), None)))
    )
    (el,) = op.elements
    head = bytes.fromhex("20010db8000000000000000000000001") + bytes([17, 0, 0, 0, 0, 53, 0, 0])
    assert el.key == head + bytes.fromhex("20010db8ffff") + bytes(10)
    assert el.key_end == head + bytes.fromhex("20010db8ffff") + b"\xff" * 10
    assert el.data is None


@dataclass(frozen=True, slots=True)
class Refused:
    op: Op
    why: str


def _add(name: str, key: str, value: Atoms | Verdict | None = None) -> Op:
    return Op("add", E(name, (k(key), value)))


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            Refused(_add("srok4", "198.18.0.200 . tcp . 80 . 203.0.113.1/24"), "host bits"),
            id="a source range with host bits set",
        ),
        pytest.param(
            Refused(_add("local4", "198.19.0.0/16"), "local4"),
            id="the local-CIDR interval set stays with libnftables",
        ),
        pytest.param(
            Refused(_add("afa4_0123", "198.18.0.9"), "afa4_0123"),
            id="affinity sets are not encoded",
        ),
        pytest.param(
            Refused(Op("add", Chain("ep4_3")), "not an element op"),
            id="a chain is not an element op",
        ),
        pytest.param(
            Refused(Op("flush", Map("be4_3")), "not an element op"),
            id="a flush is not an element op (only a full sync's batch flushes)",
        ),
        pytest.param(
            Refused(_add("ext4", "198.18.0.9 . tcp . 80"), "no value"),
            id="a map element without its value",
        ),
        pytest.param(
            Refused(_add("noep4", "198.18.0.9 . tcp . 80", ACCEPT), "is a set"),
            id="a set element with a value",
        ),
        pytest.param(
            Refused(_add("ext4", "198.18.0.9 . tcp . 80", k("198.19.1.5 . 80")), "verdicts"),
            id="a verdict map element with data instead of a verdict",
        ),
        pytest.param(
            Refused(_add("be4_2", "198.18.0.9 . tcp . 80 . 0", ACCEPT), "maps to data"),
            id="a backend map element with a verdict instead of data",
        ),
        pytest.param(
            Refused(_add("noep4", "2001:db8::1 . tcp . 80"), "IPv4"),
            id="an IPv6 address in an IPv4 set",
        ),
        pytest.param(
            Refused(_add("noep4", "198.18.0.9 . icmp . 80"), "proto"),
            id="a protocol name the encoder does not know",
        ),
        pytest.param(
            Refused(_add("noep4", "198.18.0.9 . tcp . 70000"), "port"),
            id="a port that does not fit 16 bits",
        ),
        pytest.param(
            Refused(_add("noep4", "198.18.0.9 . tcp"), "fields"),
            id="a key with a missing field",
        ),
    ],
)
def test_ops_the_fast_path_does_not_express_are_refused(case: Refused) -> None:
    with pytest.raises(Unsupported, match=case.why):
        nftnl.encode_op(case.op)
    assert nftnl.element_ops(Transaction((case.op,))) is None


def test_a_goto_without_a_chain_cannot_be_written() -> None:
    with pytest.raises(ValueError, match="goto"):
        Verdict("goto")
    with pytest.raises(ValueError, match="accept"):
        Verdict("accept", "ep4_3")


def test_a_transaction_with_anything_but_elements_is_left_to_libnftables() -> None:
    ok = _add("held4", "198.18.0.200")
    assert nftnl.element_ops(Transaction((ok,))) is not None
    assert nftnl.element_ops(Transaction((ok, Op("add", Chain("ep4_3"))))) is None
    assert nftnl.element_ops(Transaction()) is None
    many = tuple(
        ((f"198.18.{i // 256}.{i % 256}",), None) for i in range(nftnl.MAX_FAST_ELEMENTS + 1)
    )
    assert nftnl.element_ops(Transaction((Op("add", Elements("held4", many)),))) is None


@settings(max_examples=200, deadline=None)
@given(a=desired_states(), b=desired_states())
def test_every_element_op_of_a_delta_outside_local_and_affinity_sets_is_encoded(
    a: DesiredState, b: DesiredState
) -> None:
    for op in delta(a, b).ops + render(b).ops:
        if not isinstance(op.obj, Elements):
            continue
        if op.obj.set.startswith(("local", "afa")):
            with pytest.raises(Unsupported):
                nftnl.encode_op(op)
            continue
        encoded = nftnl.encode_op(op)
        assert len(encoded.elements) == len(op.obj.items)
        assert nftnl.encode_message(encoded, 1)


def _ack(seq: int, error: int) -> bytes:
    return struct.pack("=IHHII", 36, 2, 0x100, seq, 0) + struct.pack("=i", error) + bytes(16)


def test_acks_decode_to_sequence_numbers_and_errno() -> None:
    assert nftnl.decode_acks(_ack(8, 0) + _ack(9, -2)) == [(8, 0), (9, 2)]
    with pytest.raises(ValueError, match="truncated"):
        nftnl.decode_acks(_ack(8, 0)[:30] + bytes(0))
    assert nftnl.decode_acks(b"") == []


@given(st.binary(max_size=200))
def test_decode_acks_raises_only_value_error(data: bytes) -> None:
    try:
        acks = nftnl.decode_acks(data)
    except ValueError:
        return
    assert all(isinstance(seq, int) and isinstance(err, int) for seq, err in acks)


# -- the Dataplane's use of a sender ---------------------------------------------------------


class FakeSender:
    """An ElementSender that records what it is given and applies its typed ops to the fake
    runner `into`; `refuse` makes it raise NftError (applying nothing)."""

    def __init__(self) -> None:
        self.batches: list[list[ElementOp]] = []
        self.refuse = False
        self.into: FakeRunner | None = None

    def apply(self, ops: Iterable[ElementOp]) -> None:
        self.batches.append(list(ops))
        if self.refuse:
            raise NftError("kernel refused the element batch", "message 1: No such file")
        assert isinstance(ops, nftnl.ElementBatch) and self.into is not None
        self.into.run(Transaction(ops.ops))


def make_fast() -> tuple[Dataplane, FakeRunner, FakeSender]:
    sender = FakeSender()
    dp, runner, _ = make(elements=sender)
    sender.into = runner
    return dp, runner, sender


ENDPOINT_ONLY = state(
    [
        fe("198.18.0.200", endpoints=eps("198.19.1.5:8080", "198.19.1.7:8080")),
        fe("198.18.0.201", "udp", 53, endpoints=eps("198.19.1.5:53", "198.19.2.5:53")),
    ],
    held=["198.18.0.200"],
    local=["198.19.0.0/16"],
)


def test_a_full_sync_sends_structure_by_nft_and_every_element_as_one_batch() -> None:
    dp, runner, sender = make_fast()
    assert dp.sync(A).mode is SyncMode.FULL
    (batch,) = sender.batches
    assert {o.set_name for o in batch} == {"ext4", "be4_2", "held4"}
    element_lines = [ln for ln in runner.texts[0].splitlines() if " element " in ln]
    assert all(" nodelb local" in ln for ln in element_lines)  # nft fills the local sets
    assert all(o.verb == "add" for o in batch)  # a new table: nothing to flush
    assert (dp.fast_applied, dp.fast_fallbacks) == (1, 0)
    dp.request_full()
    assert dp.sync(A).mode is SyncMode.FULL
    flushes = [o.set_name for o in sender.batches[1] if o.verb == "flush"]
    assert set(flushes) >= {"ext4", "be4_2", "held4"}
    structure, elements = runner.texts[-2:]  # the runner's batch, then the sender's
    assert "flush map inet nodelb ext4" not in structure
    assert elements.startswith("flush ")
    assert runner.table.elements["be4_2"] and runner.table.elements["held4"]


def test_an_element_only_partial_sync_goes_to_the_sender_and_never_to_nft() -> None:
    dp, runner, sender = make_fast()
    assert dp.sync(A).mode is SyncMode.FULL
    texts = len(runner.texts)
    res = dp.sync(ENDPOINT_ONLY)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.PARTIAL)
    assert len(runner.texts) == texts + 1  # the sender's own text, applied by the fake
    assert [(o.verb, o.set_name, len(o.elements)) for o in sender.batches[-1]] == [
        ("delete", "be4_2", 1),
        ("add", "be4_2", 1),
    ]
    assert dp.mirror is ENDPOINT_ONLY
    assert (dp.fast_applied, dp.fast_fallbacks) == (2, 0)


def test_a_delta_that_creates_a_dispatch_chain_goes_through_nft() -> None:
    dp, runner, sender = make_fast()
    dp.sync(A)
    res = dp.sync(B)  # 198.18.0.200 gets 3 endpoints: ep4_3 and be4_3 are created
    assert res.outcome is SyncOutcome.APPLIED
    assert len(sender.batches) == 1  # the full sync's
    assert "add chain inet nodelb ep4_3" in runner.texts[-1]
    assert runner.table.elements["be4_3"]
    assert (dp.fast_applied, dp.fast_fallbacks) == (1, 0)


def test_a_refused_batch_falls_back_to_nft_with_the_same_outcome() -> None:
    dp, runner, sender = make_fast()
    dp.sync(A)
    sender.refuse = True
    res = dp.sync(ENDPOINT_ONLY)
    assert res.outcome is SyncOutcome.APPLIED
    assert len(sender.batches) == 2
    assert runner.texts[-1] == delta(A, ENDPOINT_ONLY).text()
    assert dp.mirror is ENDPOINT_ONLY
    assert (dp.fast_applied, dp.fast_fallbacks) == (1, 1)


def test_a_refused_full_element_batch_sends_the_whole_table_through_nft() -> None:
    dp, runner, sender = make_fast()
    sender.refuse = True
    res = dp.sync(A)
    assert (res.outcome, res.mode) == (SyncOutcome.APPLIED, SyncMode.FULL)
    assert (dp.fast_applied, dp.fast_fallbacks) == (0, 1)
    assert "add element inet nodelb be4_2" in runner.texts[-1]
    assert runner.table.elements["be4_2"]


def test_when_both_paths_refuse_the_sync_is_refused_and_the_mirror_stays() -> None:
    dp, runner, sender = make_fast()
    dp.sync(A)
    sender.refuse = True
    runner.fail_next = 1
    res = dp.sync(ENDPOINT_ONLY)
    assert res.outcome is SyncOutcome.REFUSED
    assert res.retry_after is not None
    assert dp.mirror is A
    assert dp.fast_fallbacks == 1
    sender.refuse = False
    assert dp.sync(ENDPOINT_ONLY).outcome is SyncOutcome.APPLIED
    assert dp.fast_applied == 2


def test_split_full_puts_every_op_in_exactly_one_part_and_refuses_the_replacing_shape() -> None:
    tx = render(B, existing=None)
    split = nftnl.split_full(tx)
    assert split is not None
    parts = [*split.structure.ops, *split.elements, *split.cleanup.ops]
    assert sorted(map(str, parts)) == sorted(map(str, tx.ops))
    assert all(nftnl.set_shape(o.target()[1]) is not None for o in split.elements)
    assert any(o.target() == ("element", "local4") for o in split.structure.ops)
    assert nftnl.split_full(render(B, replace=True)) is None


def test_a_large_op_is_split_into_messages_under_the_attribute_limit() -> None:
    many = tuple(((f"198.18.{i // 250}.{i % 250 + 1}",), None) for i in range(9000))
    ops = [
        ElementOp("flush", "held4", ()),
        nftnl.encode_op(Op("add", Elements("held4", many))),
    ]
    batch = nftnl.encode_batch(ops, 1)
    sizes, kinds, off = [], [], 20
    while off < len(batch.data) - 20:
        length, kind, *_ = struct.unpack_from("=IHHII", batch.data, off)
        sizes.append(length)
        kinds.append(kind)
        off += length
    assert kinds[0] == 0x0A0E and sizes[0] < 64  # the flush: table and set names only
    assert len(sizes) == len(batch.acked) > 2
    assert max(sizes) <= nftnl.MAX_MESSAGE_BYTES + 100
    assert sum(len(m[2]) for m in map(_pyroute2_elements, _messages(batch.data)[1:])) == 9000


def _messages(data: bytes) -> list[bytes]:
    out, off = [], 20
    while off < len(data) - 20:
        (length,) = struct.unpack_from("=I", data, off)
        out.append(data[off : off + length])
        off += length
    return out
