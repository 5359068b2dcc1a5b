"""vagrant/: the VM lab's scripts, Vagrantfile and address plan.

Nothing here boots a VM. The checks: shellcheck on every script; `ruby -c` and `vagrant
validate` on the Vagrantfile; what the Vagrantfile declares per machine (read by evaluating it
under a small recording `Vagrant.configure`) equals the netns lab's addresses from
lab/topology.py; the lab's nodelb config passes nodelb's own parser; the demo Service
asks the allocator for the lab's demo IPs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import parse_config
from agent.controller.request import ServiceRequest, request_from_raw
from lab import binaries, cluster, controlplane, topology

REPO = Path(__file__).resolve().parents[2]
VAGRANT = REPO / "vagrant"
LAB = yaml.safe_load((VAGRANT / "lab.yaml").read_text())
SCRIPTS = [*sorted(VAGRANT.rglob("*.sh")), *sorted((REPO / "scripts").glob("*.sh"))]
# Sourced by the build scripts, never run: shellchecked, but neither executable nor strict itself.
SOURCED = {REPO / "scripts" / "build-lib.sh"}
TOOL_TIMEOUT = 120.0

# Evaluates the Vagrantfile given as ARGV[0] with a Vagrant.configure that records every call
# made on the config object (and on the objects its blocks get) and prints them as JSON.
RECORDER_RB = r"""
require "json"

class Recorder
  def initialize(log, path)
    @log = log
    @path = path
  end

  def method_missing(name, *args, **kw, &blk)
    plain = ->(v) { v.is_a?(Symbol) ? v.to_s : v }
    @log << { "path" => @path, "call" => name.to_s, "args" => args.map(&plain),
              "kw" => kw.to_h { |k, v| [k.to_s, plain.(v)] } }
    child = Recorder.new(@log, @path + [name.to_s] + args.map(&:to_s))
    blk&.call(child)
    child
  end

  def respond_to_missing?(*) = true
end

module Vagrant
  LOG = []
  def self.configure(_version)
    yield Recorder.new(LOG, [])
  end
end

load ARGV[0]
puts JSON.generate(Vagrant::LOG)
"""


def machine(name: str) -> dict[str, Any]:
    """Return lab.yaml's entry for machine `name`."""
    return next(m for m in LAB["machines"] if m["name"] == name)


def within(net: IPv4Network | IPv6Network, space: IPv4Network | IPv6Network) -> bool:
    """Return True when `net` lies inside `space` (False across families)."""
    return (
        net.version == space.version
        and int(space.network_address) <= int(net.network_address)
        and int(net.broadcast_address) <= int(space.broadcast_address)
    )


def in_range(ip: IPv4Address | IPv6Address, first: Any, last: Any) -> bool:
    """Return True when `ip` is of the range's family and first <= ip <= last."""
    return ip.version == first.version and int(first) <= int(ip) <= int(last)


def require_tool(name: str) -> str:
    """Return the path of `name`; fails (not skips) when it is missing, naming the package."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: make test installs it (Debian package)")
    return path


@pytest.fixture(scope="module")
def lab_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a copy of vagrant/ beside a copy of versions.env and deploy/, in a temp dir.

    Evaluating the Vagrantfile writes its token file and `vagrant` writes .vagrant/; neither
    may land in the work tree.
    """
    root = tmp_path_factory.mktemp("vagrant-lab")
    shutil.copytree(
        VAGRANT, root / "vagrant", ignore=shutil.ignore_patterns(".vagrant", ".kubeadm-token")
    )
    shutil.copy(REPO / "versions.env", root / "versions.env")
    shutil.copytree(REPO / "deploy", root / "deploy")
    return root / "vagrant"


@pytest.fixture(scope="module")
def declared(lab_copy: Path) -> list[dict[str, Any]]:
    """Return every call the Vagrantfile makes on its config, recorded by RECORDER_RB."""
    ruby = require_tool("ruby")
    recorder = lab_copy.parent / "recorder.rb"
    recorder.write_text(RECORDER_RB)
    result = subprocess.run(
        [ruby, str(recorder), str(lab_copy / "Vagrantfile")],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    calls: list[dict[str, Any]] = json.loads(result.stdout)
    return calls


def calls_of(declared: list[dict[str, Any]], vm: str, call: str) -> list[dict[str, Any]]:
    """Return the `config.vm.define(vm) { |m| m.vm.<call>(...) }` calls, in order."""
    return [c for c in declared if c["path"] == ["vm", "define", vm, "vm"] and c["call"] == call]


def provision_env(declared: list[dict[str, Any]], vm: str, step: str) -> dict[str, str]:
    """Return the env the Vagrantfile gives provisioner `step` of machine `vm`."""
    (call,) = [c for c in calls_of(declared, vm, "provision") if c["args"][0] == step]
    env: dict[str, str] = call["kw"]["env"]
    return env


# -- scripts --------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(REPO)) for s in SCRIPTS])
def test_script_passes_shellcheck(script: Path) -> None:
    shellcheck = require_tool("shellcheck")
    result = subprocess.run(
        [shellcheck, "-x", str(script)],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
        cwd=script.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_flags_a_broken_script(tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck")
    bad = tmp_path / "bad.sh"
    bad.write_text('#!/usr/bin/env bash\ncd "$1"\nrm -rf $2/*\n')
    result = subprocess.run(
        [shellcheck, str(bad)], capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False
    )
    assert result.returncode != 0
    assert "SC2164" in result.stdout  # cd without `|| exit`


def test_every_script_is_executable_and_strict() -> None:
    problems = []
    for script in sorted(set(SCRIPTS) - SOURCED):
        if not os.access(script, os.X_OK):
            problems.append(f"{script.relative_to(REPO)}: not executable")
        if "set -euo pipefail" not in script.read_text():
            problems.append(f"{script.relative_to(REPO)}: no `set -euo pipefail`")
    assert not problems, "\n".join(problems)


def test_every_provisioner_the_vagrantfile_names_exists(declared: list[dict[str, Any]]) -> None:
    paths = {c["kw"]["path"] for c in declared if c["call"] == "provision"}
    assert paths, "the Vagrantfile declares no provisioner"
    assert all((VAGRANT / p).is_file() for p in paths), paths


# -- Vagrantfile ------------------------------------------------------------------------------


def test_vagrantfile_is_valid_ruby() -> None:
    ruby = require_tool("ruby")
    result = subprocess.run(
        [ruby, "-c", str(VAGRANT / "Vagrantfile")],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Syntax OK" in result.stdout


def _vagrant_validate(lab: Path, home: Path) -> subprocess.CompletedProcess[str]:
    # --ignore-provider: VirtualBox's checks need its VBoxManage binary (not in Debian) and
    # libvirt's the vagrant-libvirt plugin, which only comes with vagrant's recommended
    # packages (qemu, libvirt: 400 packages); everything else in the Vagrantfile is checked.
    env = dict(os.environ)
    env.update(
        VAGRANT_HOME=str(home),
        VAGRANT_CHECKPOINT_DISABLE="1",
        VAGRANT_BOX_UPDATE_CHECK_DISABLE="1",
        VAGRANT_NO_COLOR="1",
    )
    return subprocess.run(
        [require_tool("vagrant"), "validate", "--ignore-provider"],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
        cwd=lab,
        env=env,
    )


def test_vagrant_validate_accepts_the_vagrantfile(lab_copy: Path, tmp_path: Path) -> None:
    result = _vagrant_validate(lab_copy, tmp_path / "vagrant-home")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Vagrantfile validated successfully" in result.stdout


def test_vagrant_validate_refuses_a_missing_provisioner(lab_copy: Path, tmp_path: Path) -> None:
    broken = tmp_path / "vagrant"
    shutil.copytree(lab_copy, broken, ignore=shutil.ignore_patterns(".vagrant"))
    (tmp_path / "versions.env").write_text((REPO / "versions.env").read_text())
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    (broken / "provision" / "worker.sh").unlink()
    result = _vagrant_validate(broken, tmp_path / "vagrant-home")
    assert result.returncode != 0
    assert "provision/worker.sh" in result.stdout + result.stderr


# -- the address plan mirrors the netns lab ---------------------------------------------------


def test_lab_yaml_segment_and_lb_range_are_the_netns_labs() -> None:
    assert ip_network(LAB["segment"]["ipv4"]) == topology.SEGMENT4
    assert ip_network(LAB["segment"]["ipv6"]) == topology.SEGMENT6
    assert tuple(map(IPv4Address, LAB["lb_range"]["ipv4"])) == topology.LB_RANGE4
    assert tuple(map(IPv6Address, LAB["lb_range"]["ipv6"])) == topology.LB_RANGE6
    ip4, ip6 = map(ip_address, LAB["demo_ips"])
    assert in_range(ip4, *topology.LB_RANGE4)
    assert in_range(ip6, *topology.LB_RANGE6)


def test_lab_yaml_machines_have_the_netns_labs_addresses() -> None:
    cp = machine("cp")
    assert (ip_address(cp["ipv4"]), ip_address(cp["ipv6"])) == (
        topology.CONTROLPLANE4,
        topology.CONTROLPLANE6,
    )
    client = machine("client")
    assert (ip_address(client["ipv4"]), ip_address(client["ipv6"])) == (
        topology.CLIENT4,
        topology.CLIENT6,
    )
    workers = [m for m in LAB["machines"] if m["role"] == "worker"]
    assert [m["name"] for m in workers] == ["node1", "node2"]
    # The constructor only computes names and addresses (no namespaces, no root needed).
    netns_lab = topology.Lab(topology.LabSpec(nodes=len(workers)), Path("/nonexistent"))
    for m, node in zip(workers, netns_lab.nodes, strict=True):
        assert m["hostname"] == node.name
        assert (ip_address(m["ipv4"]), ip_address(m["ipv6"])) == (node.ip4, node.ip6)
        assert (ip_network(m["pod_cidr4"]), ip_network(m["pod_cidr6"])) == (
            node.pod_cidr4,
            node.pod_cidr6,
        )
        assert m["zone"] == node.zone
        assert (node.ip4, node.ip6) == topology.node_addresses(m["index"])


def test_every_lab_address_is_in_the_lab_space_and_no_two_collide() -> None:
    seen: dict[str, str] = {}
    for m in LAB["machines"]:
        for key in ("ipv4", "ipv6"):
            ip = ip_address(m[key])
            space = topology.LAB_SPACE4 if ip.version == 4 else topology.LAB_SPACE6
            segment = topology.SEGMENT4 if ip.version == 4 else topology.SEGMENT6
            assert ip in space and ip in segment, f"{m['name']} {ip}"
            assert str(ip) not in seen, f"{ip}: {m['name']} and {seen[str(ip)]}"
            seen[str(ip)] = m["name"]
            lb = topology.LB_RANGE4 if ip.version == 4 else topology.LB_RANGE6
            assert not in_range(ip, *lb), f"{m['name']} {ip} is in the LoadBalancer range"
    subnets = LAB["cluster"]["pod_subnets"] + LAB["cluster"]["service_subnets"]
    for text in subnets:
        net = ip_network(text)
        space = topology.LAB_SPACE4 if net.version == 4 else topology.LAB_SPACE6
        assert within(net, space), text


def test_cluster_subnets_are_the_netns_cluster_labs() -> None:
    assert ",".join(LAB["cluster"]["pod_subnets"]) == cluster.CLUSTER_CIDRS
    service4 = ip_network(LAB["cluster"]["service_subnets"][0])
    assert service4 == IPv4Network(controlplane.DEFAULT_SERVICE_CIDR)
    pod4, pod6 = map(ip_network, LAB["cluster"]["pod_subnets"])
    service6 = ip_network(LAB["cluster"]["service_subnets"][1])
    assert isinstance(service6, IPv6Network)
    assert not within(service6, pod6) and not within(pod6, service6)
    assert not within(service6, topology.SEGMENT6)
    for m in LAB["machines"]:
        if "pod_cidr4" in m:
            assert within(ip_network(m["pod_cidr4"]), pod4)
            assert within(ip_network(m["pod_cidr6"]), pod6)


def test_vagrantfile_declares_the_lab_yaml_machines_on_one_segment(
    declared: list[dict[str, Any]],
) -> None:
    defined = [c["args"][0] for c in declared if c["path"] == ["vm"] and c["call"] == "define"]
    assert defined == [m["name"] for m in LAB["machines"]] == ["cp", "node1", "node2", "client"]
    boxes = {c["args"][0] for c in declared if c["call"] == "box="}
    assert boxes == {"debian/bookworm64"}
    networks = set()
    for m in LAB["machines"]:
        (hostname,) = calls_of(declared, m["name"], "hostname=")
        assert hostname["args"] == [m["hostname"]]
        (net,) = calls_of(declared, m["name"], "network")
        assert net["args"] == ["private_network"]
        assert net["kw"]["ip"] == m["ipv4"]
        assert IPv4Network(f"0.0.0.0/{net['kw']['netmask']}").prefixlen == 24
        assert net["kw"]["libvirt__dhcp_enabled"] is False
        assert net["kw"]["libvirt__forward_mode"] == "none"
        networks.add((net["kw"]["virtualbox__intnet"], net["kw"]["libvirt__network_name"]))
        env = provision_env(declared, m["name"], "network")
        assert (env["LAB_IP4"], env["LAB_IP6"], env["LAB_PREFIX6"]) == (
            m["ipv4"],
            m["ipv6"],
            "64",
        )
    assert len(networks) == 1, f"machines are on different segments: {networks}"


def test_vagrantfile_gives_each_machine_the_netns_labs_pod_routes(
    declared: list[dict[str, Any]],
) -> None:
    # As in the netns lab: every host routes every other node's pod CIDRs via that node.
    for m in LAB["machines"]:
        routes = provision_env(declared, m["name"], "network")["LAB_POD_ROUTES"].split()
        expected = []
        for other in LAB["machines"]:
            if other["name"] != m["name"] and "pod_cidr4" in other:
                expected += [
                    f"{other['pod_cidr4']}={other['ipv4']}",
                    f"{other['pod_cidr6']}={other['ipv6']}",
                ]
        assert routes == expected, m["name"]
    node1 = provision_env(declared, "node1", "network")["LAB_POD_ROUTES"].split()
    cidr4, _ = topology.pod_cidrs(2)
    via4, _ = topology.node_addresses(2)
    assert f"{cidr4}={via4}" in node1


def test_vagrantfile_pins_the_kubernetes_release_of_versions_env(
    declared: list[dict[str, Any]],
) -> None:
    kube = binaries.read_versions(REPO / "versions.env")["KUBE_VERSION"].removeprefix("v")
    for name in ("cp", "node1", "node2"):
        env = provision_env(declared, name, "kubernetes")
        assert env["KUBE_VERSION"] == kube
        assert env["LAB_NAME"] == machine(name)["hostname"]
    for name in ("node1", "node2"):
        env = provision_env(declared, name, "join")
        assert env["CONTROLPLANE_IP4"] == machine("cp")["ipv4"]
        assert env["LAB_ZONE"] == machine(name)["zone"]
    steps = [c["args"][0] for c in calls_of(declared, "cp", "provision")]
    assert steps == ["network", "kubernetes", "controlplane", "nodelb"]
    steps = [c["args"][0] for c in calls_of(declared, "client", "provision")]
    assert steps == ["network", "client"]


# -- what the lab applies ---------------------------------------------------------------------


def _docs(path: Path) -> Iterator[dict[str, Any]]:
    yield from (d for d in yaml.safe_load_all(path.read_text()) if d)


def test_lab_nodelb_config_parses_and_replaces_the_deploy_configmap() -> None:
    (lab_cm,) = _docs(VAGRANT / "manifests" / "nodelb-config.yaml")
    deploy_cm = next(
        d for d in _docs(REPO / "deploy" / "daemonset.yaml") if d["kind"] == "ConfigMap"
    )
    assert lab_cm["metadata"]["name"] == deploy_cm["metadata"]["name"]
    assert lab_cm["metadata"]["namespace"] == deploy_cm["metadata"]["namespace"]
    assert set(lab_cm["data"]) == set(deploy_cm["data"])
    config = parse_config(yaml.safe_load(lab_cm["data"]["config.yaml"]))
    (pool,) = config.pools
    assert pool.name == "default"
    # The pool covers exactly the netns lab's LoadBalancer range, both families.
    covered = {int(ip) for net in pool.networks for ip in net}
    for first, last in (topology.LB_RANGE4, topology.LB_RANGE6):
        assert {int(first) + i for i in range(int(last) - int(first) + 1)} <= covered
    size = sum(
        int(last) - int(first) + 1 for first, last in (topology.LB_RANGE4, topology.LB_RANGE6)
    )
    assert len(covered) == size
    assert {str(n) for n in config.local_cidrs} == set(LAB["cluster"]["pod_subnets"])
    assert {str(n) for n in config.service_cidrs} == set(LAB["cluster"]["service_subnets"])
    assert config.external_ip_cidrs == ()


def test_demo_service_asks_nodelb_for_the_lab_demo_ips() -> None:
    docs = list(_docs(VAGRANT / "manifests" / "demo.yaml"))
    svc = next(d for d in docs if d["kind"] == "Service")
    # What the API server adds before nodelb ever sees the object.
    svc["metadata"] |= {"uid": "demo-uid", "creationTimestamp": "2026-12-01T00:00:00Z"}
    request = request_from_raw(svc, lb_class="nodelb.io/lb", handle_classless=True)
    assert isinstance(request, ServiceRequest), request
    assert request.ours
    assert set(request.requested_ips) == {ip_address(a) for a in LAB["demo_ips"]}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
