"""What the real-node lab writes for kubelet, containerd and CNI, and how it installs nodelb:
pure functions, read back as their consumers would (tomllib for containerd's TOML)."""

from __future__ import annotations

import tomllib
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.controlplane import DEFAULT_SERVICE_CIDR
from lab.kubelet import NODES_ROOT, NodePaths, kubelet_argv, kubelet_configuration
from lab.noderuntime import cni_cache_files, cni_conflist, containerd_config
from lab.realnodes import (
    CLUSTER_DNS_IP,
    COREDNS_MANIFEST,
    DEPLOY,
    LAB_EXTERNAL_CIDRS,
    LAB_POOL,
    RealNodeError,
    dns_documents,
    lab_install_documents,
)
from lab.topology import LAB_SPACE4, LAB_SPACE6, Lab, LabSpec

SPEC = LabSpec(nodes=2, pods_per_node=0, with_client=False, with_router=True, prefix="nlbtest")
LAB = Lab(SPEC, Path("/nonexistent"))
NODE = LAB.nodes[0]
PATHS = NodePaths(base=Path("/var/lib/nodelb-lab/nlbtest/node-1"), cgroup="nlbtest-node-1")


def test_containerd_config_keeps_every_path_below_the_node_and_turns_off_what_clashes() -> None:
    text = containerd_config(
        PATHS,
        runc=Path("/cache/runc"),
        sandbox_image="registry.k8s.io/pause:3.10",
        cni_bin=Path("/usr/lib/cni"),
    )
    conf = tomllib.loads(text)
    assert conf["version"] == 3
    for key in ("root", "state", "temp"):
        assert conf[key].startswith(str(PATHS.base)), key
    assert conf["grpc"]["address"] == str(PATHS.containerd_socket)
    assert "io.containerd.nri.v1.nri" in conf["disabled_plugins"]
    plugins = conf["plugins"]
    assert plugins["io.containerd.internal.v1.opt"]["path"].startswith(str(PATHS.base))
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["cni"]["conf_dir"] == str(PATHS.cni_conf_dir)
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"]["BinaryName"] == "/cache/runc"
    assert runc["options"]["SystemdCgroup"] is False
    assert runc["options"]["Root"].startswith(str(PATHS.base))
    socket_dir = plugins["io.containerd.shim.v1.manager"]["socket_dir"]
    assert socket_dir.startswith(str(PATHS.base))
    # containerd refuses a socket_dir over 42 characters on Linux: the longest a lab makes
    # (a random 9-character prefix, node-80) must fit.
    longest = NodePaths(base=NODES_ROOT / "nlb123abc" / "node-80", cgroup="x")
    assert len(str(longest.shim_socket_dir)) <= 42
    images = plugins["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.10"


def test_only_the_nodes_own_sandboxes_cni_cache_files_are_taken(tmp_path: Path) -> None:
    for name in ("lab-pods-aaa-eth0", "cni-loopback-aaa-lo", "lab-pods-bbb-eth0", "other-aaa-eth0"):
        (tmp_path / name).touch()
    got = [p.name for p in cni_cache_files({"aaa"}, tmp_path)]
    assert got == ["cni-loopback-aaa-lo", "lab-pods-aaa-eth0"]
    assert cni_cache_files(set(), tmp_path) == []


def test_the_cni_network_hands_out_the_nodes_pod_cidrs_and_routes_only_the_lab_space() -> None:
    conf = cni_conflist(1, NODE.pod_cidr4, NODE.pod_cidr6, PATHS)
    bridge = conf["plugins"][0]
    assert bridge["bridge"] == "cbr0" and bridge["ipMasq"] is False
    ipam = bridge["ipam"]
    assert ipam["dataDir"].startswith(str(PATHS.base))
    subnets = [ip_network(r[0]["subnet"]) for r in ipam["ranges"]]
    assert subnets == [NODE.pod_cidr4, NODE.pod_cidr6]
    for r in ipam["ranges"]:
        assert ip_address(r[0]["gateway"]) in ip_network(r[0]["subnet"])
    assert [ip_network(r["dst"]) for r in ipam["routes"]] == [LAB_SPACE4, LAB_SPACE6]


def test_kubelet_runs_with_cgroup_v1_its_own_cgroup_root_and_no_oom_score_change() -> None:
    conf: dict[str, Any] = kubelet_configuration(NODE, PATHS, client_ca=Path("/pki/ca.crt"))
    assert conf["failCgroupV1"] is False
    assert conf["cgroupDriver"] == "cgroupfs"
    assert conf["cgroupRoot"] == "/nlbtest-node-1"
    assert conf["oomScoreAdj"] == 0
    assert conf["containerRuntimeEndpoint"] == f"unix://{PATHS.containerd_socket}"
    assert conf["address"] == str(NODE.ip4)
    assert conf["podLogsDir"].startswith(str(PATHS.base))
    assert conf["authentication"]["anonymous"]["enabled"] is False
    argv = kubelet_argv(Path("/bin/kubelet"), NODE, PATHS)
    assert f"--node-ip={NODE.ip4},{NODE.ip6}" in argv
    assert f"--node-labels=topology.kubernetes.io/zone={NODE.zone}" in argv
    assert f"--root-dir={PATHS.kubelet_root}" in argv


def _without(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") != kind]


def test_the_lab_installs_deploy_as_shipped_but_for_the_sample_addresses() -> None:
    ds_text = (DEPLOY / "daemonset.yaml").read_text()
    policy_text = (DEPLOY / "admission-policy.yaml").read_text()
    ds, policy = lab_install_documents(ds_text, policy_text)
    shipped_ds = [d for d in yaml.safe_load_all(ds_text) if d]
    shipped_policy = [d for d in yaml.safe_load_all(policy_text) if d]
    assert _without(ds, "ConfigMap") == _without(shipped_ds, "ConfigMap")
    (config_map,) = [d for d in ds if d["kind"] == "ConfigMap"]
    (shipped_cm,) = [d for d in shipped_ds if d["kind"] == "ConfigMap"]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    shipped = yaml.safe_load(shipped_cm["data"]["config.yaml"])
    assert config["externalIPCIDRs"] == list(LAB_EXTERNAL_CIDRS)
    assert [p["addresses"] for p in config["pools"]] == [list(LAB_POOL)]
    for key in set(shipped) - {"externalIPCIDRs", "pools"}:
        assert config[key] == shipped[key], key
    for pool, shipped_pool in zip(config["pools"], shipped["pools"], strict=True):
        assert {k: v for k, v in pool.items() if k != "addresses"} == {
            k: v for k, v in shipped_pool.items() if k != "addresses"
        }
    assert _without(policy, "ValidatingAdmissionPolicy") == _without(
        shipped_policy, "ValidatingAdmissionPolicy"
    )
    changed = [
        (var["name"], var["expression"])
        for doc, before in zip(policy, shipped_policy, strict=True)
        if doc["kind"] == "ValidatingAdmissionPolicy"
        for var, old in zip(
            doc["spec"].get("variables", []), before["spec"].get("variables", []), strict=True
        )
        if var != old
    ]
    assert sorted(name for name, _ in changed) == ["allowedCIDRs", "poolCIDRs"]


def test_the_lab_pool_lies_on_the_segment_inside_its_external_ip_range() -> None:
    segment = {4: ip_network("198.18.0.0/24"), 6: ip_network("2001:db8::/64")}
    for pool, allowed in zip(LAB_POOL, LAB_EXTERNAL_CIDRS, strict=True):
        net, outer = ip_network(pool), ip_network(allowed)
        assert net.subnet_of(segment[net.version])  # type: ignore[arg-type]
        assert net.subnet_of(outer)  # type: ignore[arg-type]
        assert not any(n.ip4 in net or n.ip6 in net for n in LAB.nodes)


def test_a_policy_without_the_address_variables_is_refused() -> None:
    ds_text = (DEPLOY / "daemonset.yaml").read_text()
    with pytest.raises(RealNodeError, match="allowedCIDRs and poolCIDRs"):
        lab_install_documents(ds_text, "kind: ValidatingAdmissionPolicy\nspec: {variables: []}\n")


def test_coredns_gets_the_pinned_image_and_the_address_the_kubelets_name() -> None:
    docs = dns_documents(COREDNS_MANIFEST.read_text(), image="example/coredns:v9", cluster_ip="x")
    by_kind = {d["kind"]: d for d in docs}
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"]] == ["example/coredns:v9"]
    assert by_kind["Service"]["spec"]["clusterIP"] == "x"
    assert by_kind["Service"]["metadata"] == {
        "name": "kube-dns",
        "namespace": "kube-system",
        "labels": {"k8s-app": "kube-dns"},
    }
    # The kubelets' clusterDNS is in the Service range, and the lab passes the same address.
    assert ip_address(CLUSTER_DNS_IP) in ip_network(DEFAULT_SERVICE_CIDR)
    config = kubelet_configuration(
        NODE, PATHS, client_ca=Path("/ca.crt"), cluster_dns=[CLUSTER_DNS_IP]
    )
    assert config["clusterDNS"] == [CLUSTER_DNS_IP]


def test_a_coredns_manifest_without_its_placeholders_is_refused() -> None:
    text = COREDNS_MANIFEST.read_text().replace("CLUSTER_DNS_IP", "198.18.128.10")
    with pytest.raises(RealNodeError, match="replaced 1 and 0"):
        dns_documents(text, image="example/coredns:v9", cluster_ip="x")
