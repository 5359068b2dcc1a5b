#!/usr/bin/env bash
# Every machine: the segment's IPv6 address and the routes to the other machines' pod CIDRs,
# now and at every boot (Vagrant's private_network only sets the IPv4 address).
# Env (from the Vagrantfile): LAB_IP4, LAB_IP6, LAB_PREFIX6, LAB_POD_ROUTES ("cidr=via ...").
set -euo pipefail
: "${LAB_IP4:?}" "${LAB_IP6:?}" "${LAB_PREFIX6:?}"

cat > /etc/default/nodelb-lab <<CONF
LAB_IP4='$LAB_IP4'
LAB_IP6='$LAB_IP6'
LAB_PREFIX6='$LAB_PREFIX6'
LAB_POD_ROUTES='${LAB_POD_ROUTES:-}'
CONF
install -m 0755 /vagrant/provision/lab-net.sh /usr/local/sbin/nodelb-lab-net
cat > /etc/systemd/system/nodelb-lab-net.service <<'UNIT'
[Unit]
Description=nodelb lab: IPv6 segment address and pod routes
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/nodelb-lab-net

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now nodelb-lab-net.service
systemctl restart nodelb-lab-net.service
