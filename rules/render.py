"""DesiredState -> the FULL nftables transaction that replaces the nodelb table atomically.

The transaction starts with `add table` + `delete table` + `add table`: inside one nft batch
this removes whatever the table held (chains and maps whose definition changed included) and
builds the new one, and the kernel commits the batch at once, so packets never see a gap or a
half-built table. `add` before `delete` makes the delete valid when the table did not exist.
"""

from __future__ import annotations

from agent.model import DesiredState
from rules import layout as L
from rules.plan import (
    Contributions,
    Emitter,
    RenderError,
    check_mark,
    dispatch_ops,
    node_elements,
)
from rules.transaction import Op, Transaction, Verb

__all__ = ["RenderError", "element_ops", "render", "render_cleanup", "skeleton_ops"]

_T = L.TABLE


def render_cleanup() -> Transaction:
    """Return the transaction that removes the nodelb table, a no-op error-free if absent."""
    return Transaction((Op("add", f"table {_T}"), Op("delete", f"table {_T}")))


def _key_rule(chain: str, fam: int, tail: str) -> Op:
    ip = L.IP[fam]
    return Op("add", f"rule {_T} {chain} {ip} daddr . meta l4proto . th dport {tail}")


def skeleton_ops(mark: int) -> list[Op]:
    """Return the fixed part of the table: sets, maps, regular chains' declarations.

    Base chains come later (`base_chain_ops`) so that they hook in only once everything they
    reference exists.
    """
    ops: list[Op] = []
    for fam in (4, 6):
        kt, at = L.KEY_TYPE[fam], L.ADDR_TYPE[fam]
        ops += [
            Op("add", f"map {_T} {L.named(L.EXT, fam)} {{ type {kt} : verdict ; }}"),
            Op("add", f"map {_T} {L.named(L.INT, fam)} {{ type {kt} : verdict ; }}"),
            Op("add", f"set {_T} {L.named(L.NOEP, fam)} {{ type {kt} ; }}"),
            Op("add", f"set {_T} {L.named(L.DROP, fam)} {{ type {kt} ; }}"),
            Op("add", f"set {_T} {L.named(L.SRFE, fam)} {{ type {kt} ; }}"),
            Op(
                "add",
                f"set {_T} {L.named(L.SROK, fam)} {{ type {kt} . {at} ; flags interval ; }}",
            ),
            Op("add", f"set {_T} {L.named(L.HELD, fam)} {{ type {at} ; }}"),
            Op("add", f"set {_T} {L.named(L.LOCAL, fam)} {{ type {at} ; flags interval ; }}"),
        ]
    ops += [
        Op("add", f"chain {_T} {L.REJECT}"),
        Op("add", f"rule {_T} {L.REJECT} meta l4proto tcp reject with tcp reset"),
        Op("add", f"rule {_T} {L.REJECT} reject"),
        Op("add", f"chain {_T} {L.NAT_INTERNAL}"),
    ]
    return ops


def base_chain_ops(mark: int) -> list[Op]:
    """Return the rules of nat_internal and every base chain (hooked, with priorities)."""
    ops: list[Op] = []
    for base in (L.INT, L.EXT):
        for fam in (4, 6):
            ops.append(_key_rule(L.NAT_INTERNAL, fam, f"vmap @{L.named(base, fam)}"))

    def base_chain(name: str, kind: str, hook: str, prio: str) -> None:
        ops.append(
            Op(
                "add",
                f"chain {_T} {name} {{ type {kind} hook {hook} priority {prio} ; "
                "policy accept ; }",
            )
        )

    def rule(chain: str, text: str) -> None:
        ops.append(Op("add", f"rule {_T} {chain} {text}"))

    base_chain(L.NAT_PREROUTING, "nat", "prerouting", L.NAT_PRIORITY)
    for fam in (4, 6):
        rule(L.NAT_PREROUTING, f"{L.IP[fam]} saddr @{L.named(L.LOCAL, fam)} goto {L.NAT_INTERNAL}")
    for fam in (4, 6):
        ops.append(_key_rule(L.NAT_PREROUTING, fam, f"vmap @{L.named(L.EXT, fam)}"))

    base_chain(L.NAT_OUTPUT, "nat", "output", L.NAT_OUTPUT_PRIORITY)
    rule(L.NAT_OUTPUT, f"goto {L.NAT_INTERNAL}")

    base_chain(L.NAT_POSTROUTING, "nat", "postrouting", L.POSTROUTING_PRIORITY)
    rule(L.NAT_POSTROUTING, f"meta mark & {mark:#x} == 0 return")
    rule(
        L.NAT_POSTROUTING,
        f"meta mark set meta mark & {mark ^ 0xFFFFFFFF:#x} masquerade fully-random",
    )

    base_chain(L.FILTER_PREROUTING, "filter", "prerouting", L.FILTER_PRE_PRIORITY)
    rule(L.FILTER_PREROUTING, 'iifname "lo" return')
    for fam in (4, 6):
        ip = L.IP[fam]
        rule(
            L.FILTER_PREROUTING,
            f"ct state new {ip} daddr . meta l4proto . th dport @{L.named(L.SRFE, fam)} "
            f"{ip} daddr . meta l4proto . th dport . {ip} saddr != @{L.named(L.SROK, fam)} drop",
        )
    for fam in (4, 6):
        rule(L.FILTER_PREROUTING, f"{L.IP[fam]} saddr @{L.named(L.LOCAL, fam)} return")
    for fam in (4, 6):
        ops.append(_key_rule(L.FILTER_PREROUTING, fam, f"@{L.named(L.DROP, fam)} drop"))

    for name, hook in (
        (L.FILTER_INPUT, "input"),
        (L.FILTER_FORWARD, "forward"),
        (L.FILTER_OUTPUT, "output"),
    ):
        base_chain(name, "filter", hook, L.FILTER_PRIORITY)
        for fam in (4, 6):
            ip = L.IP[fam]
            rule(
                name,
                f"ct state new {ip} daddr . meta l4proto . th dport @{L.named(L.NOEP, fam)} "
                f"goto {L.REJECT}",
            )
    for fam in (4, 6):
        rule(
            L.FILTER_INPUT,
            f"ct direction original {L.IP[fam]} daddr @{L.named(L.HELD, fam)} "
            "meta l4proto { tcp, udp, sctp } drop",
        )
    return ops


def element_ops(
    verb: Verb, elements: dict[str, list[tuple[str, str | None]]], *, keys_only: bool = False
) -> list[Op]:
    """Return one bulk `verb element` op per non-empty map/set, names in sorted order.

    `keys_only` drops map values (nft deletes map elements by key).
    """
    ops: list[Op] = []
    for name in sorted(elements):
        pairs = elements[name]
        if not pairs:
            continue
        if keys_only:
            body = ", ".join([k for k, _ in pairs])
        else:
            body = ", ".join([k if v is None else k + " : " + v for k, v in pairs])
        ops.append(Op(verb, f"element {_T} {name} {{ {body} }}"))
    return ops


def render(desired: DesiredState, *, mark: int = L.DEFAULT_MASQ_MARK) -> Transaction:
    """Return the full transaction that makes the nodelb table express exactly `desired`.

    `mark` is the meta mark mask that requests masquerading. Raises RenderError naming the
    Service when a frontend cannot be expressed (address family mix, port out of 1..65535,
    affinity timeout out of 1..86400, frontend filed under a key that is not its own).
    """
    check_mark(mark)
    acc = Contributions()
    emitter = Emitter(mark)
    for k, fe in desired.frontends.items():
        if k != fe.key:
            raise RenderError(fe.service, f"frontend {fe.key} is filed under key {k}")
        emitter.emit(acc, fe)
    ops = [
        Op("add", f"table {_T}"),
        Op("delete", f"table {_T}"),
        Op("add", f'table {_T} {{ comment "managed by nodelb; do not edit" ; }}'),
    ]
    ops += skeleton_ops(mark)
    for dkey in sorted(acc.dispatch):
        ops += dispatch_ops(dkey, mark, flush=False)
    for unit in sorted(acc.units.values(), key=lambda u: (u.rank, u.name)):
        ops += unit.add
    ops += base_chain_ops(mark)
    elements = dict(acc.elements)
    elements.update(node_elements(desired))
    ops += element_ops("add", elements)
    return Transaction(tuple(ops))
