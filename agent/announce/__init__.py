"""Who holds an IP: the ownership plan (pure), the announcer thread, and the VRRPv3 speaker.

`ownership` ranks the eligible nodes of every LoadBalancer IP and places the IPs on VRIDs;
`inputs` builds its input from the node's cluster view and turns a plan into the speaker's
configuration; `announcer` drives the speaker child and reports what this node holds.
`vrrp/` is the protocol: codec and state machine (pure), GARP/NA, sockets, the speaker.
"""
