"""The tools on top of the core and the services: the `recmesh` command line,
the local supervisor (`recmesh up`), benchmarks, training, the demo data and
the encoder's export. Nothing in recmesh/ outside this package, and nothing in
services/, imports from here (tests/unit/test_layers.py)."""
