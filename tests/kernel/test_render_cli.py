"""`nodelb render`: kubectl-style files in, the agent's exact transaction out, accepted by nft."""

from __future__ import annotations

import contextlib
import io
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from agent.cli import main
from lab import netns

OBJECTS = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: demo, uid: u1, creationTimestamp: "2026-01-01T00:00:00Z"}
  spec:
    type: LoadBalancer
    externalTrafficPolicy: Local
    sessionAffinity: ClientIP
    loadBalancerSourceRanges: [198.18.0.0/24]
    ports: [{name: http, port: 80, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
  status: {loadBalancer: {ingress: [{ip: 198.18.0.200}, {ip: "2001:db8::200"}]}}
- apiVersion: v1
  kind: Service
  metadata: {name: broken, namespace: demo, uid: u2}
  spec: {type: LoadBalancer, ports: [{name: http, port: 0}]}
  status: {loadBalancer: {ingress: [{ip: 198.18.0.201}]}}
- apiVersion: v1
  kind: Service
  metadata: {name: other, namespace: demo, uid: u3}
  spec: {type: LoadBalancer, loadBalancerClass: example.com/other, ports: [{port: 80}]}
  status: {loadBalancer: {ingress: [{ip: 198.18.0.202}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 8081, protocol: UDP}]
endpoints:
- {addresses: [198.19.1.11], nodeName: node-1}
- {addresses: [198.19.2.11], nodeName: node-2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 8081, protocol: UDP}]
endpoints:
- {addresses: ["2001:db8:1:1::11"], nodeName: node-1}
---
apiVersion: v1
kind: Node
metadata: {name: node-1, labels: {topology.kubernetes.io/zone: zone-a}}
spec: {podCIDRs: [198.19.1.0/24, "2001:db8:1:1::/64"]}
"""


def render(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["render", *args])
    return code, out.getvalue(), err.getvalue()


# An agent serves only ingress IPs inside a pool (agent/node/holdable.py), so render does too.
CONFIG = """
pools:
- {name: render, addresses: [198.18.0.200/30, "2001:db8::200/126"]}
"""


@pytest.fixture
def objects(tmp_path: Path) -> Path:
    """Return the objects file; the config file with its pools lies beside it (config_of)."""
    path = tmp_path / "objects.yaml"
    path.write_text(OBJECTS)
    path.with_name("config.yaml").write_text(CONFIG)
    return path


def config_of(objects: Path) -> str:
    return f"--config={objects.with_name('config.yaml')}"


@pytest.fixture
def scratch_ns() -> Iterator[str]:
    name = f"nlbr-{secrets.token_hex(3)}"
    netns.create(name)
    try:
        yield name
    finally:
        netns.delete(name)


def test_render_json_shows_this_nodes_choice_and_reports_the_broken_service(
    objects: Path,
) -> None:
    code, out, err = render(["--node", "node-1", "-f", str(objects), config_of(objects), "--json"])
    assert code == 0
    state = orjson.loads(out)
    by_key = {(f["ip"], f["protocol"], f["port"]): f for f in state["frontends"]}
    assert set(by_key) == {
        ("198.18.0.200", "tcp", 80),
        ("198.18.0.200", "udp", 53),
        ("2001:db8::200", "tcp", 80),
        ("2001:db8::200", "udp", 53),
    }
    web = by_key[("198.18.0.200", "tcp", 80)]
    assert web["endpoints"] == ["198.19.1.11:8080"]  # Local: node-1's endpoint only
    assert web["clusterEndpoints"] == ["198.19.1.11:8080", "198.19.2.11:8080"]
    assert web["sessionAffinityTimeout"] == 10800
    assert by_key[("2001:db8::200", "udp", 53)]["endpoints"] == ["[2001:db8:1:1::11]:8081"]
    assert state["heldIPs"] == ["198.18.0.200", "2001:db8::200"]
    assert state["localCIDRs"] == ["198.19.1.0/24", "2001:db8:1:1::/64"]
    assert "demo/broken: InvalidService: spec.ports[0].port" in err
    assert "198.18.0.202" not in out  # another class: nothing at all


@pytest.mark.kernel
def test_render_output_is_accepted_by_nft_as_is(objects: Path, scratch_ns: str) -> None:
    code, out, _ = render(["--node", "node-1", "-f", str(objects), config_of(objects)])
    assert code == 0
    assert out.startswith("add table inet nodelb")
    netns.run(scratch_ns, ["nft", "-f", "-"], input=out)
    listed = netns.run(scratch_ns, ["nft", "list", "table", "inet", "nodelb"]).stdout
    assert "198.18.0.200 . tcp . 80" in listed
    assert "2001:db8::200 . udp . 53" in listed
    # eTP=Local: node-1's endpoint is the hairpin source its pods' traffic is masqueraded for.
    assert "198.18.0.200 . tcp . 80 . 198.19.1.11" in listed
    assert "2001:db8::200 . udp . 53 . 2001:db8:1:1::11" in listed
    # Applying it again over the existing table is also accepted (it replaces it whole).
    netns.run(scratch_ns, ["nft", "-f", "-"], input=out)


def test_render_refuses_a_file_that_is_not_kubernetes_objects(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("just: a mapping\n")
    code, out, err = render(["--node", "node-1", "-f", str(bad)])
    assert code == 2
    assert out == ""
    assert "not a Kubernetes object" in err


def test_the_console_script_runs_render(objects: Path) -> None:
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "nodelb"),
            "render",
            "--node",
            "node-2",
            "-f",
            str(objects),
            config_of(objects),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    web = next(f for f in orjson.loads(proc.stdout)["frontends"] if f["protocol"] == "tcp")
    assert web["endpoints"] == ["198.19.2.11:8080"]
