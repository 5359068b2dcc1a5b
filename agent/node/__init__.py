"""The node role: what one node programs and holds, from the cluster's objects; and its loop."""
