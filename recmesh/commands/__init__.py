"""The `recmesh` command groups, one module each; recmesh.cli assembles them."""
