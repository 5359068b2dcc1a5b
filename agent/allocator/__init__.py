"""Address allocation for LoadBalancer Services: pools, the allocator, Event rate limiting.

Everything in this package is pure (no API client, no clock, no I/O); the controller shell
that watches Services and writes status lives elsewhere and drives it.
"""
