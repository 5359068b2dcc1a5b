"""What one frontend contributes to the table: map/set elements, dispatch chains, affinity units.

Shared by rules/render.py (everything, in bulk) and rules/delta.py (only changed frontends).
Every name and element is a pure function of the frontend, so a delta names what it deletes
from the old desired state alone, without kernel handles.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.model.desired_state import DesiredState, Endpoint, Frontend
from agent.model.net import IPAddress, IPNetwork, Protocol
from rules import layout as L
from rules.transaction import Atoms, Chain, Item, Map, Op, Rule, Set, Verdict

_MAX_MARK = 0xFFFFFFFF


class RenderError(ValueError):
    """A desired state nodelb cannot express; `service` names the offending Service."""

    def __init__(self, service: str, message: str) -> None:
        super().__init__(f"{service}: {message}")
        self.service = service


def check_mark(mark: int) -> None:
    """Raise RenderError unless `mark` is a usable 32-bit meta mark mask (non-zero)."""
    if not 0 < mark <= _MAX_MARK:
        raise RenderError("-", f"masquerade mark {mark:#x} must be a non-zero 32-bit mask")


@dataclass(frozen=True, slots=True)
class Unit:
    """One object of a session-affinity unit: a set, an endpoint chain or a service chain.

    `rank` orders creation (sets 0, endpoint chains 1, service chains 2); deletion runs in the
    reverse rank order so nothing is deleted while still referenced.
    """

    name: str
    rank: int
    add: tuple[Op, ...]
    delete: Op


DispatchKey = tuple[L.DispatchKind, int, int]
"""(kind, family, endpoint count) of a dispatch chain and its backend map."""


@dataclass(slots=True)
class Contributions:
    """Accumulated output of `emit`: elements per map/set name, dispatch keys, affinity units.

    `elements[name]` holds (key, value) items; value is None for plain sets.
    """

    elements: defaultdict[str, list[Item]] = field(default_factory=lambda: defaultdict(list))
    dispatch: set[DispatchKey] = field(default_factory=set)
    units: dict[str, Unit] = field(default_factory=dict)


_IDX = tuple(str(i) for i in range(4096))
_INDEX_ATOMS = tuple((s,) for s in _IDX)  # a backend element's last key atom, as a 1-tuple


_PORTS: dict[int, str] = {}
"""Port atoms above _IDX's range, made once each: a full render writes every backend's port,
and 100k copies of "8080" cost ~5 MB at the peak. Bounded (at most 65,535 small strings,
in practice a few dozen), so it may live as long as the module."""


def _port(p: int) -> str:
    if p < len(_IDX):
        return _IDX[p]
    text = _PORTS.get(p)
    if text is None:
        text = _PORTS[p] = str(p)
    return text


def _check_port(service: str, what: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise RenderError(service, f"{what} port {port} is outside 1..65535")


Backend = tuple[str, str]
"""An endpoint as nft text: (address, port), which is also a backend map element's value."""


def normalize_endpoints(fe: Frontend, eps: tuple[Endpoint, ...]) -> tuple[Backend, ...]:
    """Return `eps` deduplicated, sorted by (address, port), as (address, port) atom pairs.

    Sorting makes the backend index of each endpoint independent of the order the caches
    listed them in. Raises RenderError on an address of the wrong family or a bad port.
    """
    if not eps:
        return ()
    fam_cls = type(fe.key.ip)
    seen: dict[tuple[int, int], Endpoint] = {}
    for ep in eps:
        ip, port = ep.ip, ep.port
        if type(ip) is not fam_cls:
            raise RenderError(
                fe.service,
                f"endpoint {ip} is IPv{ip.version} but frontend {fe.key.ip} is "
                f"IPv{fe.key.ip.version}",
            )
        if not 1 <= port <= 65535:
            _check_port(fe.service, f"endpoint {ip}", port)
        seen[(int(ip), port)] = ep
    order = sorted(seen)
    if fam_cls is ipaddress.IPv4Address:
        return tuple(
            [(f"{i >> 24}.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", _port(p)) for i, p in order]
        )
    return tuple([(str(seen[k].ip), _port(k[1])) for k in order])


def validate(fe: Frontend) -> None:
    """Raise RenderError naming the Service if the frontend's own fields are out of range."""
    if not isinstance(fe.key.protocol, Protocol):
        raise RenderError(fe.service, f"unknown protocol {fe.key.protocol!r}")
    _check_port(fe.service, "frontend", fe.key.port)
    t = fe.affinity_timeout
    if t is not None and not 1 <= t <= L.MAX_AFFINITY_TIMEOUT:
        raise RenderError(
            fe.service, f"session affinity timeout {t}s is outside 1..{L.MAX_AFFINITY_TIMEOUT}"
        )


def source_ranges(fe: Frontend) -> list[IPNetwork]:
    """Return the frontend's source ranges of its own family, collapsed (no overlaps).

    Ranges of the other family are ignored (a dual-stack Service lists both). If the Service
    lists ranges but none of this family, the result is empty and the frontend stays
    restricted: every source is dropped (fail closed).
    """
    fam = fe.key.ip.version
    return collapse(n for n in fe.source_ranges if n.version == fam)


def _h(*parts: object) -> str:
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).hexdigest()


def mark_rules(kind: L.DispatchKind, family: int, mark: int) -> tuple[str, ...]:
    """Return the rules a path of `kind` runs before its DNAT to ask for masquerading.

    No rule for `epl` (Local, external: the client's address must reach the pod); one
    unconditional rule for `ep` and `epc`; for `epi` (a Local frontend's internal path) the
    two cases kube-proxy masquerades there, so that any other pod keeps its own address:
    - the source is one of the frontend's local endpoints (@hpi: daddr . l4proto . dport .
      saddr). The DNAT may pick that very pod, which would drop a packet from its own address
      (hairpin); which endpoint numgen picks is unknown here, so such a pod is masqueraded
      whichever endpoint serves it (an over-approximation, docs/dataplane.md);
    - the source is not a pod of this node: nat_internal is entered from prerouting only by
      @local sources, so the packet comes from the node itself, whose source address may be
      one replies would not bring back here (the LB IP itself, when this node holds it).
    """
    if kind == "epl":
        return ()
    set_mark = f"meta mark set meta mark | {mark:#x}"
    if kind != "epi":
        return (set_mark,)
    ip = L.IP[family]
    return (
        f"{ip} daddr . meta l4proto . th dport . {ip} saddr @{L.named(L.HAIRPIN, family)} "
        f"{set_mark}",
        f"{ip} saddr != @{L.named(L.LOCAL, family)} {set_mark}",
    )


_MASQ_TOKEN: dict[L.DispatchKind, object] = {
    "ep": True,
    "epc": True,
    "epl": False,
    "epi": "hairpin-or-node",
}
"""What an affinity service chain's name hashes for its masquerade rules: the booleans these
names always hashed for the unconditional mark and for none, a token of its own for epi's."""


def _affinity_units(
    fe: Frontend, key: Atoms, *, kind: L.DispatchKind, eps: tuple[Backend, ...], mark: int
) -> tuple[str, list[Unit]]:
    """Return the service-chain name and every object of one affinity path (kube-proxy shape).

    `kind` is the dispatch kind the path would use without affinity: it decides the mark rules
    (`mark_rules`) and the variant. Names are content hashes of the frontend key's text, the
    variant, the timeout and the endpoints (and, for the service chain, its mark rules), so an
    object that exists is never changed (a change is a new name).
    """
    # Both internal kinds share variant "c": the endpoint chains and client sets of an
    # internal path do not depend on its mark rules, so a frontend whose policy changes
    # between Cluster (with its own internal endpoints) and Local keeps its clients there.
    variant = "c" if kind in ("epc", "epi") else "x"
    fam = fe.key.ip.version
    ip = L.IP[fam]
    timeout = fe.affinity_timeout
    proto = fe.key.protocol.value
    key_text = " . ".join(key)
    units: list[Unit] = []
    ep_chains: list[tuple[str, str]] = []
    for addr, port in eps:
        eid = _h(key_text, variant, timeout, addr, port)
        set_name = f"{L.AFF_SET}{fam}_{eid}"
        chain = f"{L.AFF_ENDPOINT}{fam}_{eid}"
        target = f"{addr}:{port}" if fam == 4 else f"[{addr}]:{port}"
        aff_set = Set(set_name, L.ADDR_TYPE[fam], flags=("dynamic", "timeout"), timeout=timeout)
        units.append(Unit(set_name, 0, (Op("add", aff_set),), Op("delete", Set(set_name))))
        units.append(
            Unit(
                chain,
                1,
                (
                    Op("add", Chain(chain)),
                    Op("add", Rule(chain, f"update @{set_name} {{ {ip} saddr }}")),
                    Op("add", Rule(chain, f"meta l4proto {proto} dnat {ip} to {target}")),
                ),
                Op("delete", Chain(chain)),
            )
        )
        ep_chains.append((set_name, chain))
    # Hashed with integer ports, as these names always were: an upgraded agent keeps them.
    svc_id = _h(key_text, variant, timeout, _MASQ_TOKEN[kind], *((a, int(p)) for a, p in eps))
    svc = f"{L.AFF_SERVICE}{fam}_{svc_id}"
    ops = [Op("add", Chain(svc))]
    ops.extend(Op("add", Rule(svc, text)) for text in mark_rules(kind, fam, mark))
    ops.extend(Op("add", Rule(svc, f"{ip} saddr @{s} goto {c}")) for s, c in ep_chains)
    vmap = ", ".join(f"{i} : goto {c}" for i, (_, c) in enumerate(ep_chains))
    ops.append(Op("add", Rule(svc, f"numgen random mod {len(eps)} vmap {{ {vmap} }}")))
    units.append(Unit(svc, 2, tuple(ops), Op("delete", Chain(svc))))
    return svc, units


_ACCEPT = Verdict("accept")


class Emitter:
    """Turns frontends into Contributions; holds caches shared across one render or delta."""

    __slots__ = ("mark",)

    def __init__(self, mark: int) -> None:
        self.mark = mark

    def _path(
        self,
        acc: Contributions,
        fe: Frontend,
        key: Atoms,
        eps: tuple[Backend, ...],
        kind: L.DispatchKind,
    ) -> Verdict:
        """Add the backends of one traffic path; return the verdict that dispatches to them."""
        fam = fe.key.ip.version
        if fe.affinity_timeout is not None:
            svc, units = _affinity_units(fe, key, kind=kind, eps=eps, mark=self.mark)
            for u in units:
                acc.units[u.name] = u
            return Verdict("goto", svc)
        n = len(eps)
        acc.dispatch.add((kind, fam, n))
        # The endpoint pair is the element's value as it is (Backend is (address, port)).
        index = _INDEX_ATOMS if n <= len(_INDEX_ATOMS) else tuple((str(i),) for i in range(n))
        acc.elements[L.backend_map(kind, fam, n)].extend(
            [(key + index[i], ep) for i, ep in enumerate(eps)]
        )
        return Verdict("goto", L.dispatch_chain(kind, fam, n))

    def emit(self, acc: Contributions, fe: Frontend) -> None:
        """Validate `fe` and add everything it needs to `acc`; raise RenderError if invalid."""
        validate(fe)
        k = fe.key
        fam = 4 if type(k.ip) is ipaddress.IPv4Address else 6
        key: Atoms = (str(k.ip), k.protocol.value, _port(k.port))
        ext = normalize_endpoints(fe, fe.endpoints)
        if fe.cluster_endpoints is fe.endpoints:
            cl = ext
        else:
            cl = normalize_endpoints(fe, fe.cluster_endpoints)
        el = acc.elements
        # External traffic: DNAT (masqueraded unless Local), else drop (Local) or reject.
        if ext:
            verdict = self._path(acc, fe, key, ext, "epl" if fe.local_only else "ep")
            el[L.named(L.EXT, fam)].append((key, verdict))
        elif fe.local_only:
            el[L.named(L.DROP, fam)].append((key, None))
        # Internal traffic (this node, its pods): the cluster endpoints. Masqueraded, except
        # a pod's traffic to a Local frontend (kube-proxy keeps the pod's address there).
        # Falls through to the external map unless its endpoints or masquerading differ.
        override = fe.local_only or cl != ext
        int_eps = cl if override else ext
        if override:
            if cl:
                verdict = self._path(acc, fe, key, cl, "epi" if fe.local_only else "epc")
                el[L.named(L.INT, fam)].append((key, verdict))
                if fe.local_only:
                    el[L.named(L.HAIRPIN, fam)].extend(hairpin_elements(key, ext, cl))
            elif ext:
                el[L.named(L.INT, fam)].append((key, _ACCEPT))  # no DNAT: rejected in filter
        if not int_eps or (not ext and not fe.local_only):
            el[L.named(L.NOEP, fam)].append((key, None))
        if fe.source_ranges:
            el[L.named(L.SRFE, fam)].append((key, None))
            el[L.named(L.SROK, fam)].extend(
                [((*key, n.with_prefixlen), None) for n in source_ranges(fe)]
            )

    def dispatch_keys(self, fe: Frontend) -> set[DispatchKey]:
        """Return the dispatch chains `fe` uses; raises RenderError like `emit`."""
        acc = Contributions()
        self.emit(acc, fe)
        return acc.dispatch


def hairpin_elements(
    key: Atoms, local: tuple[Backend, ...], cluster: tuple[Backend, ...]
) -> list[Item]:
    """Return the @hpi elements of a Local frontend: its key and each address that is both a
    local endpoint and one of the cluster endpoints its internal path may pick.

    `local` and `cluster` are normalized endpoint lists (`normalize_endpoints`); the result is
    in the order of `cluster` (sorted), one element per address (a pod listed with two ports
    is one source). A local endpoint that is not in the cluster list (a terminating pod while
    ready ones exist elsewhere, or one topology left out) is never picked, so it needs no
    masquerade and keeps its address. Every element starts with the frontend's key, so no two
    frontends share one and a delta deletes them from the old state alone.
    """
    own = {addr for addr, _ in local}
    hits = dict.fromkeys(addr for addr, _ in cluster if addr in own)
    return [((*key, addr), None) for addr in hits]


def dispatch_ops(key: DispatchKey, mark: int) -> list[Op]:
    """Return the ops that create one dispatch chain and its backend map.

    Both must be new in the batch (see rules/layout.py: nft 1.0.6 refuses a rule over a
    backend map it loads from the kernel). The map is declared with `th dport`, not `tcp
    dport`: a protocol in the map's value makes nft add `meta l4proto tcp` to the rule, and
    UDP and SCTP would no longer match.
    """
    kind, fam, n = key
    ip = L.IP[fam]
    chain = L.dispatch_chain(kind, fam, n)
    bmap = L.backend_map(kind, fam, n)
    ops = [
        Op(
            "add",
            Map(
                bmap,
                f"{ip} daddr . meta l4proto . th dport . numgen random mod 1",
                f"{ip} daddr . th dport",
                typeof=True,
            ),
        ),
        Op("add", Chain(chain)),
    ]
    ops.extend(Op("add", Rule(chain, text)) for text in mark_rules(kind, fam, mark))
    ops.append(
        Op(
            "add",
            Rule(
                chain,
                f"dnat {ip} to {ip} daddr . meta l4proto . th dport . "
                f"numgen random mod {n} map @{bmap}",
            ),
        )
    )
    return ops


def node_elements(desired: DesiredState) -> dict[str, list[Item]]:
    """Return the held-IP and local-CIDR set elements of `desired`, per set name."""
    out: dict[str, list[Item]] = {}
    for fam in (4, 6):
        held = sorted((ip for ip in desired.held_ips if ip.version == fam), key=_addr_key)
        if held:
            out[L.named(L.HELD, fam)] = [((str(ip),), None) for ip in held]
        nets = collapse(n for n in desired.local_cidrs if n.version == fam)
        if nets:
            out[L.named(L.LOCAL, fam)] = [((n.with_prefixlen,), None) for n in nets]
    return out


def _addr_key(ip: IPAddress) -> int:
    return int(ip)


def collapse(nets: Iterable[IPNetwork]) -> list[IPNetwork]:
    """Return `nets` merged into the fewest non-overlapping networks, IPv4 first, sorted."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for n in nets:
        if isinstance(n, ipaddress.IPv4Network):
            v4.append(n)
        else:
            v6.append(n)
    out: list[IPNetwork] = list(ipaddress.collapse_addresses(v4))
    out.extend(ipaddress.collapse_addresses(v6))
    return out
