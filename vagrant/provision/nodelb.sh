#!/usr/bin/env bash
# cp: install nodelb from the repository's deploy/ (synced to /vagrant-deploy), the lab's
# nodelb configuration (pool = the segment's free LoadBalancer range) and the demo Service.
# Objects wait in Pending until the workers have joined; nothing here needs them yet.
set -euo pipefail
export KUBECONFIG=/etc/kubernetes/admin.conf

kubectl apply --server-side -f /vagrant-deploy/daemonset.yaml
# Replaces the sample configuration in daemonset.yaml with the lab's addresses.
kubectl apply --server-side --force-conflicts -f /vagrant/manifests/nodelb-config.yaml
if [[ -f /vagrant-deploy/admission-policy.yaml ]]; then
  kubectl apply --server-side -f /vagrant-deploy/admission-policy.yaml
fi
kubectl apply --server-side -f /vagrant/manifests/demo.yaml
echo "nodelb and the demo are applied; watch them with: vagrant ssh cp -c 'kubectl get pods -A -o wide'"
