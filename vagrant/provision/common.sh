#!/usr/bin/env bash
# cp and workers: kernel settings, containerd, kubelet/kubeadm/kubectl pinned to the
# repository's KUBE_VERSION (versions.env), and the lab's pod network (a bridge per node, as
# cbr0 in the netns lab, with static per-node pod CIDRs and routes instead of an overlay).
# Env (from the Vagrantfile): KUBE_VERSION (e.g. 1.37.2), LAB_NAME, LAB_IP4, LAB_IP6,
# LAB_POD_CIDR4, LAB_POD_CIDR6, LAB_ZONE (empty on cp).
set -euo pipefail
: "${KUBE_VERSION:?}" "${LAB_NAME:?}" "${LAB_IP4:?}" "${LAB_IP6:?}"
: "${LAB_POD_CIDR4:?}" "${LAB_POD_CIDR6:?}"
export DEBIAN_FRONTEND=noninteractive
minor="${KUBE_VERSION%.*}"

# kubelet refuses to run with swap on.
swapoff -a
sed -i '/\sswap\s/ s/^#*/#/' /etc/fstab

cat > /etc/modules-load.d/nodelb-lab.conf <<'CONF'
overlay
br_netfilter
CONF
modprobe overlay
modprobe br_netfilter
cat > /etc/sysctl.d/90-nodelb-lab.conf <<'CONF'
net.ipv4.ip_forward = 1
net.ipv6.conf.all.forwarding = 1
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
CONF
sysctl -q --system

apt-get update -qq
apt-get install -y -qq ca-certificates curl gpg nftables conntrack
install -d -m 0755 /etc/apt/keyrings
# Debian 12's containerd is 1.6, which current Kubernetes no longer supports: take
# containerd 2 from Docker's repository (the package containerd.io).
curl -fsSL https://download.docker.com/linux/debian/gpg |
  gpg --dearmor --yes -o /etc/apt/keyrings/docker.gpg
echo "deb [signed-by=/etc/apt/keyrings/docker.gpg] https://download.docker.com/linux/debian bookworm stable" \
  > /etc/apt/sources.list.d/docker.list
curl -fsSL "https://pkgs.k8s.io/core:/stable:/v$minor/deb/Release.key" |
  gpg --dearmor --yes -o /etc/apt/keyrings/kubernetes.gpg
echo "deb [signed-by=/etc/apt/keyrings/kubernetes.gpg] https://pkgs.k8s.io/core:/stable:/v$minor/deb/ /" \
  > /etc/apt/sources.list.d/kubernetes.list
apt-get update -qq
# The repository's package versions look like 1.37.2-1.1: pick the one of this release.
pkgver="$(apt-cache madison kubeadm | awk -v v="$KUBE_VERSION" '$3 ~ "^" v "-" { print $3; exit }')"
if [[ -z "$pkgver" ]]; then
  echo "kubeadm $KUBE_VERSION is not in pkgs.k8s.io v$minor" >&2
  exit 1
fi
apt-get install -y -qq --allow-change-held-packages containerd.io \
  "kubelet=$pkgver" "kubeadm=$pkgver" "kubectl=$pkgver"
apt-mark hold kubelet kubeadm kubectl

# containerd.io ships a config with the CRI plugin disabled; start from the full default.
containerd config default > /etc/containerd/config.toml
sed -i 's/SystemdCgroup = false/SystemdCgroup = true/' /etc/containerd/config.toml
systemctl restart containerd

# kubelet on the segment addresses (the first NIC is Vagrant's NAT), zone label as in the
# netns lab (kubelet may set topology.kubernetes.io/* on its own Node).
args="--node-ip=$LAB_IP4,$LAB_IP6"
if [[ -n "${LAB_ZONE:-}" ]]; then
  args+=" --node-labels=topology.kubernetes.io/zone=$LAB_ZONE"
fi
echo "KUBELET_EXTRA_ARGS=\"$args\"" > /etc/default/kubelet

# Pod network: bridge cbr0, gateway .1 / ::1 of this node's pod CIDRs, no masquerade (pods
# keep their addresses across nodes; the other machines route the CIDR to this node).
gw4="${LAB_POD_CIDR4%.*}.1"
gw6="${LAB_POD_CIDR6%%/*}1"
install -d -m 0755 /etc/cni/net.d
cat > /etc/cni/net.d/10-nodelb-lab.conflist <<CONF
{
  "cniVersion": "1.0.0",
  "name": "nodelb-lab",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cbr0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [
          [{ "subnet": "$LAB_POD_CIDR4", "gateway": "$gw4" }],
          [{ "subnet": "$LAB_POD_CIDR6", "gateway": "$gw6" }]
        ],
        "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
CONF
systemctl enable kubelet
