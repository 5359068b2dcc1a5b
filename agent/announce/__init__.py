"""Who holds an IP: the VRRPv3 wire codec and election state machine (pure), and their shells.

`vrrp_codec` turns advertisements into bytes and back (checksums and every validation
included); `vrrp_state` is the RFC 5798 §6.4 state machine as a pure `step` function. Neither
imports socket, asyncio or time: the I/O layer owns sockets and clocks and feeds them events.
"""
