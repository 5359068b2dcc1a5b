"""The allocation controller: the allocator, KEP-4631 conditions, status planning, the loop."""
