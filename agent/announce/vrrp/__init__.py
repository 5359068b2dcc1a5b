"""VRRPv3: codec and state machine (pure), GARP/NA, sockets, addresses, the speaker process."""
