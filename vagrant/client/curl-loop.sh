#!/usr/bin/env bash
# Ask the demo Service's LoadBalancer IPs which pod answers and which client address it saw,
# once a second: a takeover shows as a short run of failures, then answers again.
# Usage: nodelb-demo-client [COUNT] (default: until Ctrl-C). IPs: DEMO_IPS, comma-separated.
set -euo pipefail
# shellcheck source=/dev/null
[[ -r /etc/default/nodelb-demo ]] && source /etc/default/nodelb-demo
IFS=, read -r -a ips <<< "${DEMO_IPS:-198.18.0.200,2001:db8::200}"
count="${1:-0}"
i=0
while [[ "$count" -eq 0 || "$i" -lt "$count" ]]; do
  i=$((i + 1))
  for ip in "${ips[@]}"; do
    host="$ip"
    [[ "$ip" == *:* ]] && host="[$ip]"
    if pod="$(curl -fsS --max-time 1 "http://$host/hostname" 2>&1)"; then
      seen="$(curl -fsS --max-time 1 "http://$host/clientip" 2>&1 || echo '?')"
      printf '%s %-16s pod=%s client=%s\n' "$(date +%T)" "$ip" "$pod" "$seen"
    else
      printf '%s %-16s FAILED %s\n' "$(date +%T)" "$ip" "$pod"
    fi
  done
  sleep 1
done
