"""DesiredState -> the FULL nftables transaction that makes the nodelb table express it.

Normally the table is rewritten in place, in one batch: `add table` (creates it if absent),
`add` of every set, map and chain (a no-op for an identical declaration that exists), `flush`
of every set, map and chain that exists, their rules and elements again, and finally `flush`
and `delete` of the objects the kernel holds that the new state does not use. Dispatch chains
that exist are left as they are (their content is a function of their name, layout and mark,
which the table's comment records; nft 1.0.6 could not re-add their rules anyway, see
rules/layout.py); only their backend maps are flushed and refilled. The base chains stay
hooked and no chain a packet may jump to is re-created, and the kernel commits the batch at
once, so packets see the old table or the new one.

When the existing table cannot be reused (another layout or mark, a base chain with another
hook or priority, a set where a map is needed), or when asked to, the transaction is the
replacing shape instead: `add table` + `delete table` + `add table`, which throws everything
away inside the same batch. Measured: that shape loses about one new UDP flow in 1000 syncs
(its base chains are unhooked and hooked again); the in-place shape lost none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.model import tunnel as TUNNEL
from agent.model.desired_state import DesiredState
from rules import layout as L
from rules.plan import (
    Contributions,
    Emitter,
    RenderError,
    check_mark,
    dispatch_ops,
    node_elements,
)
from rules.transaction import (
    Chain,
    Elements,
    Hook,
    Item,
    Map,
    Op,
    Rule,
    Set,
    Table,
    Transaction,
    Verb,
)

__all__ = [
    "KernelObjects",
    "RenderError",
    "element_ops",
    "objects_after",
    "render",
    "render_cleanup",
    "skeleton_ops",
]

_T = L.TABLE


@dataclass(frozen=True, slots=True)
class KernelObjects:
    """The objects an existing nodelb table holds, by name: what a full render must know.

    `comment` is the table's comment ("" if none; `layout.table_comment(mark)` marks the
    current layout and mark). `chains` maps every chain name to its hook declaration
    (`hook_spec`), "" for a regular chain. `sets` maps every set and map name to "set" or
    "map". Plain data: the applier builds it from its own transactions (`objects_after`) or
    from the kernel (agent/dataplane/netlink_dump.py, or `rules.readback.kernel_objects`).
    """

    comment: str = ""
    chains: Mapping[str, str] = field(default_factory=dict)
    sets: Mapping[str, str] = field(default_factory=dict)


def priority_value(text: str) -> int | str:
    """Return a chain priority (`dstnat - 10`, `-110`, `srcnat`) as a number (text if unknown)."""
    parts = text.split()
    try:
        if parts and parts[0] in L.PRIORITY_BASES:
            base = L.PRIORITY_BASES[parts[0]]
            if len(parts) == 1:
                return base
            if len(parts) == 3 and parts[1] in "+-":
                return base + int(parts[2]) * (1 if parts[1] == "+" else -1)
        return int("".join(parts))
    except ValueError:
        return text.strip()


def hook_spec(hook: Hook | None) -> str:
    """Return the canonical form of a chain's hook, `nat prerouting -110 accept` ("" for a
    regular chain): what the kernel reports back, whatever symbolic priority was written."""
    if hook is None:
        return ""
    return f"{hook.type} {hook.hook} {priority_value(hook.priority)} {hook.policy}"


def objects_after(existing: KernelObjects | None, tx: Transaction) -> KernelObjects | None:
    """Return the objects of the table after `tx` is applied to one holding `existing`.

    None means no table (before and after). Only object commands count, not rules or elements.
    """
    comment = existing.comment if existing is not None else None
    chains = dict(existing.chains) if existing is not None else {}
    sets = dict(existing.sets) if existing is not None else {}
    for op in tx.ops:
        obj = op.obj
        if isinstance(obj, Table):
            if op.verb == "delete":
                comment, chains, sets = None, {}, {}
            elif op.verb == "add" and comment is None:
                comment = obj.comment or ""
        elif isinstance(obj, Chain):
            if op.verb == "add":
                chains.setdefault(obj.name, hook_spec(obj.hook))
            elif op.verb == "delete":
                chains.pop(obj.name, None)
        elif isinstance(obj, Set | Map):
            if op.verb == "add":
                sets.setdefault(obj.name, "map" if isinstance(obj, Map) else "set")
            elif op.verb == "delete":
                sets.pop(obj.name, None)
    if comment is None:
        return None
    return KernelObjects(comment, chains, sets)


def _reusable(existing: KernelObjects, new: KernelObjects) -> bool:
    """Return True when `existing` can be rewritten in place into a table holding `new`."""
    if existing.comment != new.comment:
        return False
    if any(existing.chains.get(n, spec) != spec for n, spec in new.chains.items()):
        return False
    return all(existing.sets.get(n, kind) == kind for n, kind in new.sets.items())


def render_cleanup() -> Transaction:
    """Return the transaction that removes the nodelb table, a no-op error-free if absent."""
    return Transaction((Op("add", Table()), Op("delete", Table())))


def _key_rule(chain: str, fam: int, tail: str) -> Op:
    return Op("add", Rule(chain, f"{L.IP[fam]} daddr . meta l4proto . th dport {tail}"))


def skeleton_ops(mark: int) -> list[Op]:
    """Return the fixed part of the table: sets, maps, regular chains' declarations.

    Base chains come later (`base_chain_ops`) so that they hook in only once everything they
    reference exists.
    """
    ops: list[Op] = []
    for fam in (4, 6):
        kt, at = L.KEY_TYPE[fam], L.ADDR_TYPE[fam]
        ops += [
            Op("add", Map(L.named(L.EXT, fam), kt, "verdict")),
            Op("add", Map(L.named(L.INT, fam), kt, "verdict")),
            Op("add", Set(L.named(L.NOEP, fam), kt)),
            Op("add", Set(L.named(L.DROP, fam), kt)),
            Op("add", Set(L.named(L.SRFE, fam), kt)),
            Op("add", Set(L.named(L.SROK, fam), f"{kt} . {at}", flags=("interval",))),
            Op("add", Set(L.named(L.HELD, fam), at)),
            Op("add", Set(L.named(L.LOCAL, fam), at, flags=("interval",))),
            Op("add", Set(L.named(L.HAIRPIN, fam), f"{kt} . {at}")),
        ]
    ops += [
        Op("add", Chain(L.REJECT)),
        Op("add", Rule(L.REJECT, "meta l4proto tcp reject with tcp reset")),
        Op("add", Rule(L.REJECT, "reject")),
        Op("add", Chain(L.NAT_INTERNAL)),
    ]
    return ops


def tunnel_forward_rules() -> tuple[str, ...]:
    """Return the forward rules of a node serving flows that came through the spread tunnel.

    A new flow arriving on the tunnel device gets TUNNEL_CT_MARK; the SYN-ACK of such a flow
    has its MSS lowered to what fits in the tunnel, because with direct server return the
    client's packets are the encapsulated ones (docs/decisions.md, 2026-12-05). Inert on a
    node without the device.
    """
    bit = f"{L.TUNNEL_CT_MARK:#x}"
    clamp = "tcp flags syn,ack / syn,ack tcp option maxseg size"
    return (
        f'iifname "{TUNNEL.IFNAME}" ct state new ct mark set ct mark | {bit}',
        f"ct mark & {bit} != 0 meta nfproto ipv4 {clamp} > {TUNNEL.MSS4} "
        f"tcp option maxseg size set {TUNNEL.MSS4}",
        f"ct mark & {bit} != 0 meta nfproto ipv6 {clamp} > {TUNNEL.MSS6} "
        f"tcp option maxseg size set {TUNNEL.MSS6}",
    )


def base_chain_ops(mark: int) -> list[Op]:
    """Return the rules of nat_internal and every base chain (hooked, with priorities)."""
    ops: list[Op] = []
    for base in (L.INT, L.EXT):
        for fam in (4, 6):
            ops.append(_key_rule(L.NAT_INTERNAL, fam, f"vmap @{L.named(base, fam)}"))

    def base_chain(name: str, kind: str, hook: str, prio: str) -> None:
        ops.append(Op("add", Chain(name, Hook(kind, hook, prio))))

    def rule(chain: str, text: str) -> None:
        ops.append(Op("add", Rule(chain, text)))

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
        if name == L.FILTER_FORWARD:
            ops.extend(Op("add", Rule(name, text)) for text in tunnel_forward_rules())
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
    verb: Verb, elements: Mapping[str, list[Item]], *, keys_only: bool = False
) -> list[Op]:
    """Return one bulk `verb element` op per non-empty map/set, names in sorted order.

    `keys_only` drops map values (nft deletes map elements by key).
    """
    ops: list[Op] = []
    for name in sorted(elements):
        items = elements[name]
        if not items:
            continue
        if keys_only:
            items = [(k, None) for k, _ in items]
        ops.append(Op(verb, Elements(name, tuple(items))))
    return ops


def render(
    desired: DesiredState,
    *,
    mark: int = L.DEFAULT_MASQ_MARK,
    existing: KernelObjects | None = None,
    replace: bool = False,
) -> Transaction:
    """Return the full transaction that makes the nodelb table express exactly `desired`.

    `existing` describes the table the kernel holds now. None means there is no table: the
    transaction creates it and flushes nothing. Otherwise the table is rewritten in place,
    keeping the dispatch chains it holds and deleting every object not in `desired`; unless
    `existing` cannot be reused (see the module docstring). Then, and whenever `replace` is
    True, the transaction replaces the whole table.

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
    create = Op("add", Table(L.table_comment(mark)))
    body = skeleton_ops(mark)
    for dkey in sorted(acc.dispatch):
        body += dispatch_ops(dkey, mark)
    for unit in sorted(acc.units.values(), key=lambda u: (u.rank, u.name)):
        body += unit.add
    body += base_chain_ops(mark)
    elements = dict(acc.elements)
    elements.update(node_elements(desired))
    new = objects_after(None, Transaction((create, *body)))
    assert new is not None
    if replace or (existing is not None and not _reusable(existing, new)):
        ops = [Op("add", Table()), Op("delete", Table()), create, *body]
        ops += element_ops("add", elements)
        return Transaction(tuple(ops))
    had_chains = existing.chains if existing is not None else {}
    had_sets = existing.sets if existing is not None else {}
    ops = [create]
    for op in body:
        kind, name = op.target()
        if name in had_chains and L.is_dispatch_object(name):
            continue  # kept as it is: its content is a function of its name (and the comment)
        ops.append(op)
        if op.verb != "add":
            continue
        if kind == "chain" and name in had_chains:
            ops.append(Op("flush", Chain(name)))
        elif isinstance(op.obj, Set | Map) and name in had_sets and not name.startswith(L.AFF_SET):
            ops.append(Op("flush", type(op.obj)(name)))  # affinity sets keep their clients
    ops += element_ops("add", elements)
    stale_chains = sorted(n for n in had_chains if n not in new.chains)
    ops += [Op("flush", Chain(n)) for n in stale_chains]
    ops += [Op("delete", Chain(n)) for n in stale_chains]
    ops += [
        Op("delete", Map(name) if kind == "map" else Set(name))
        for name, kind in sorted(had_sets.items())
        if name not in new.sets
    ]
    return Transaction(tuple(ops))
