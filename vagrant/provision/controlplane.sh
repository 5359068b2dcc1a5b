#!/usr/bin/env bash
# cp: kubeadm init (dual-stack, kube-proxy in nftables mode) from a kubeadm config file.
# Skipped when the cluster already exists, so `vagrant provision cp` is safe to re-run.
# Env: KUBE_VERSION, KUBEADM_TOKEN, LAB_NAME, LAB_IP4, LAB_IP6, POD_SUBNETS, SERVICE_SUBNETS.
set -euo pipefail
: "${KUBE_VERSION:?}" "${KUBEADM_TOKEN:?}" "${LAB_NAME:?}" "${LAB_IP4:?}" "${LAB_IP6:?}"
: "${POD_SUBNETS:?}" "${SERVICE_SUBNETS:?}"

if [[ ! -f /etc/kubernetes/admin.conf ]]; then
  cat > /root/kubeadm.yaml <<CONF
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
  # The lab's token (vagrant/.kubeadm-token), never expiring, so a worker can join later.
  - token: "$KUBEADM_TOKEN"
    ttl: "0s"
    usages: [signing, authentication]
    groups: ["system:bootstrappers:kubeadm:default-node-token"]
localAPIEndpoint:
  advertiseAddress: "$LAB_IP4"
  bindPort: 6443
nodeRegistration:
  name: "$LAB_NAME"
  criSocket: unix:///run/containerd/containerd.sock
  kubeletExtraArgs:
    - name: node-ip
      value: "$LAB_IP4,$LAB_IP6"
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: "v$KUBE_VERSION"
controlPlaneEndpoint: "$LAB_IP4:6443"
networking:
  podSubnet: "$POD_SUBNETS"
  serviceSubnet: "$SERVICE_SUBNETS"
controllerManager:
  extraArgs:
    # Pod CIDRs are static per node (lab.yaml, the CNI config), not handed out.
    - name: allocate-node-cidrs
      value: "false"
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: "$POD_SUBNETS"
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
CONF
  kubeadm init --config /root/kubeadm.yaml
fi

install -d -o vagrant -g vagrant -m 0700 /home/vagrant/.kube
install -o vagrant -g vagrant -m 0600 /etc/kubernetes/admin.conf /home/vagrant/.kube/config
