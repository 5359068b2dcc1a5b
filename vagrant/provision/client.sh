#!/usr/bin/env bash
# client: curl, and the demo loop (asking DEMO_IPS, from lab.yaml) installed as /usr/local/bin/nodelb-demo-client.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq curl
echo "DEMO_IPS='${DEMO_IPS:-}'" > /etc/default/nodelb-demo
install -m 0755 /vagrant/client/curl-loop.sh /usr/local/bin/nodelb-demo-client
echo "run the demo client with: vagrant ssh client -c nodelb-demo-client"
