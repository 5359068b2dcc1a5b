"""The allocation controller: leader election, status planning and the node reports it reads."""
