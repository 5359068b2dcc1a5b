#!/usr/bin/env bash
# node1, node2: join the cluster cp created. Waits (bounded) for cp's API server, since
# providers may bring machines up in parallel. Skipped when the node has already joined.
# Env: KUBEADM_TOKEN, CONTROLPLANE_IP4, LAB_NAME, LAB_IP4, LAB_IP6.
set -euo pipefail
: "${KUBEADM_TOKEN:?}" "${CONTROLPLANE_IP4:?}" "${LAB_NAME:?}" "${LAB_IP4:?}" "${LAB_IP6:?}"

if [[ -f /etc/kubernetes/kubelet.conf ]]; then
  echo "$LAB_NAME has already joined"
  exit 0
fi

for _ in $(seq 1 120); do
  if curl -fsk --max-time 5 "https://$CONTROLPLANE_IP4:6443/readyz" >/dev/null; then
    break
  fi
  sleep 5
done

cat > /root/kubeadm-join.yaml <<CONF
apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: "$CONTROLPLANE_IP4:6443"
    token: "$KUBEADM_TOKEN"
    # The lab's segment is isolated and the token is per lab; pinning the CA hash would need
    # a channel from cp to the workers that Vagrant's one-way rsync does not give.
    unsafeSkipCAVerification: true
nodeRegistration:
  name: "$LAB_NAME"
  criSocket: unix:///run/containerd/containerd.sock
  kubeletExtraArgs:
    - name: node-ip
      value: "$LAB_IP4,$LAB_IP6"
CONF
kubeadm join --config /root/kubeadm-join.yaml
