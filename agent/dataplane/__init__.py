"""What goes into the kernel: the applier, its libnftables and netlink back ends, read-back."""
