"""Where arrays live: the device mesh, sharding rules, and multi-process runs."""
