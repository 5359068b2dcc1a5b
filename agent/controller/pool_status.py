"""A LoadBalancerIPPool's status from its verdict and its usage (pure).

`status` holds per family the addresses the pool may hand out (`total`), those held by
Services (`assigned`) and the rest (`available`); a family the pool in force has no address
of is left out. Counts saturate at 2^63-1 (the schema's int64): an IPv6 /64 holds 2^64.

`addressesInForce` lists the CIDRs of the version in force (the previous valid one while an
edit is refused; empty when none): the agents serve those when the spec does not parse.

Conditions (metav1.Condition shape; `lastTransitionTime` moves only when `status` does):

- ``Valid``: True when the object's own spec is in force; False with the verdict's reason
  (InvalidSpec, OverlapsCluster, OverlapsPool) and a message naming the field or the other
  party, saying whether its previous valid version is still in force.
- ``Exhausted``: True when no family of the pool in force has an address left; Unknown with
  NotInForce when no version of the object is in force.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.controller.pool_objects import PoolVerdict, PoolVerdictReason
from agent.model.net import IPAddress

INT64_MAX = (1 << 63) - 1


def usage(verdict: PoolVerdict, held: Sequence[IPAddress]) -> dict[str, dict[str, int]]:
    """Return the per-family counts of the pool in force for `verdict` ({} when none).

    `held` are the addresses Services hold (the allocator's allocations).
    """
    pool = verdict.pool
    if pool is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    for version in sorted(pool.families()):
        total = pool.size(version)
        assigned = sum(1 for ip in held if ip.version == version and pool.contains(ip))
        out[f"ipv{version}"] = {
            "total": min(total, INT64_MAX),
            "assigned": assigned,
            "available": min(max(0, total - assigned), INT64_MAX),
        }
    return out


def _condition(
    previous: Mapping[str, Mapping[str, Any]],
    kind: str,
    status: str,
    reason: str,
    message: str,
    *,
    generation: int,
    now: str,
) -> dict[str, Any]:
    """Return one condition, keeping its lastTransitionTime while its status stays."""
    before = previous.get(kind) or {}
    since = before.get("lastTransitionTime") if before.get("status") == status else None
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
        "observedGeneration": generation,
    }


def valid_message(verdict: PoolVerdict) -> str:
    """Return the Valid condition's message: the problem and what is in force instead."""
    if verdict.reason is PoolVerdictReason.VALID:
        return "the pool's spec is in force"
    if verdict.previous:
        return f"{verdict.message}; its previous valid version stays in force"
    return f"{verdict.message}; none of its addresses are handed out"


def pool_status(
    verdict: PoolVerdict,
    counts: Mapping[str, Mapping[str, int]],
    *,
    now: str,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the status an object should have (`now`: RFC 3339 for new transitions).

    `previous` is the newest status known (the one last written, which the watch may not
    have echoed yet); by default the object's own.
    """
    old = verdict.obj.status if previous is None else previous
    conditions = {
        str(c.get("type")): c for c in (old.get("conditions") or []) if isinstance(c, Mapping)
    }
    gen = verdict.obj.generation
    valid = verdict.reason is PoolVerdictReason.VALID
    cond = [
        _condition(
            conditions,
            "Valid",
            "True" if valid else "False",
            verdict.reason.value,
            valid_message(verdict),
            generation=gen,
            now=now,
        )
    ]
    if verdict.pool is None:
        exhausted = ("Unknown", "NotInForce", "no version of the pool is in force")
    elif all(c["available"] == 0 for c in counts.values()):
        exhausted = ("True", "Exhausted", "every address of the pool is assigned")
    else:
        left = ", ".join(f"{c['available']} {fam}" for fam, c in sorted(counts.items()))
        exhausted = ("False", "AddressesAvailable", f"available: {left}")
    cond.append(_condition(conditions, "Exhausted", *exhausted, generation=gen, now=now))
    in_force = [str(n) for n in verdict.pool.networks] if verdict.pool is not None else []
    return {
        "observedGeneration": gen,
        **counts,
        "addressesInForce": in_force,
        "conditions": cond,
    }
