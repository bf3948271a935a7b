"""`recmesh bench ...`: throughput and latency figures measured in one run,
each with a baseline measured in the same run, since machines are noisy."""
