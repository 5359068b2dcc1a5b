#!/usr/bin/env bash
# Put this machine's lab IPv6 address and pod routes on the segment interface (the one that
# holds LAB_IP4). Installed as /usr/local/sbin/nodelb-lab-net, run by nodelb-lab-net.service.
# Idempotent: `ip ... replace` everywhere.
set -euo pipefail
# shellcheck source=/dev/null
source /etc/default/nodelb-lab

dev="$(ip -o -4 addr show | awk -v ip="$LAB_IP4" '{ split($4, a, "/"); if (a[1] == ip) { print $2; exit } }')"
if [[ -z "$dev" ]]; then
  echo "nodelb-lab-net: no interface holds $LAB_IP4" >&2
  exit 1
fi
# As in the netns lab: no DAD (the address works at once), no router advertisements, no
# reverse-path filter (a held LoadBalancer IP answers from wherever traffic came in).
sysctl -q -w "net.ipv6.conf.$dev.accept_dad=0" "net.ipv6.conf.$dev.accept_ra=0" \
  net.ipv4.conf.all.rp_filter=0 "net.ipv4.conf.$dev.rp_filter=0"
ip -6 addr replace "$LAB_IP6/$LAB_PREFIX6" dev "$dev" nodad
for route in $LAB_POD_ROUTES; do
  ip route replace "${route%%=*}" via "${route#*=}" dev "$dev"
done
