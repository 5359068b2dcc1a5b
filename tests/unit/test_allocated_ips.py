"""IPOwners: who owns each LoadBalancer IP, and which Services a move of owner concerns."""

from __future__ import annotations

import ipaddress
import random

from agent.model.net import IPAddress
from agent.node.allocated_ips import IPOwners

A, B = ipaddress.ip_address("198.18.0.10"), ipaddress.ip_address("2001:db8::10")


def test_the_oldest_claimant_owns_an_address_and_external_users_hear_of_moves() -> None:
    owners = IPOwners()
    assert owners.update("ns/user", age=("3", "u", "ns/user"), external_ips=[A]) == set()
    assert owners.update("ns/new", age=("2", "n", "ns/new"), lb_ips=[A, B]) == {"ns/user"}
    assert dict(owners.owners) == {A: "ns/new", B: "ns/new"}
    assert owners.update("ns/old", age=("1", "o", "ns/old"), lb_ips=[A]) == {"ns/user"}
    assert owners.owners[A] == "ns/old"
    # A younger claimant changes nothing; neither does the user changing its own addresses.
    assert owners.update("ns/young", age=("4", "y", "ns/young"), lb_ips=[A]) == set()
    assert owners.update("ns/user", age=("3", "u", "ns/user"), external_ips=[A, B]) == set()
    # The owner going gives the address to the next oldest; B's users hear of B's owner going.
    assert owners.update("ns/old", age=("1", "o", "ns/old")) == {"ns/user"}
    assert owners.owners[A] == "ns/new"
    assert owners.update("ns/new", age=("2", "n", "ns/new")) == {"ns/user"}
    assert dict(owners.owners) == {A: "ns/young"}
    # A user that no longer names the address is not told about it.
    owners.update("ns/user", age=("3", "u", "ns/user"))
    assert owners.update("ns/young", age=("4", "y", "ns/young")) == set()
    assert dict(owners.owners) == {}


def test_a_service_naming_its_own_address_is_not_returned_to_itself() -> None:
    owners = IPOwners()
    assert owners.update("ns/a", age=("1", "a", "ns/a"), lb_ips=[A], external_ips=[A]) == set()
    assert owners.owners[A] == "ns/a"


def test_owners_kept_one_claim_at_a_time_equal_the_oldest_claimant_after_every_change() -> None:
    # Claims come and go in a random order (seeded); after each one the owner of every
    # address is the oldest of its claimants by (creation, uid, key), as a full election says.
    rng = random.Random(17)
    ips = [ipaddress.ip_address(f"198.18.0.{i}") for i in range(1, 5)]
    ages = {
        f"ns/s{i}": (f"2026-12-01T10:{rng.randrange(3):02d}", f"u{i}", f"ns/s{i}")
        for i in range(30)
    }
    held: dict[str, set[IPAddress]] = {}
    owners = IPOwners()
    for step in range(600):
        key = rng.choice(sorted(ages))
        held[key] = set(rng.sample(ips, rng.randrange(3)))
        owners.update(key, age=ages[key], lb_ips=held[key])
        expected = {
            ip: min((k for k, h in held.items() if ip in h), key=lambda k: ages[k])
            for ip in ips
            if any(ip in h for h in held.values())
        }
        assert dict(owners.owners) == expected, f"step {step}"
