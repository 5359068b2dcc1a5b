"""Values every role shares, parsed at the boundary: addresses, Services, Nodes, slices, pools."""
