"""The `recmesh` command line: one module per command group, each adding its
subcommands (`add_commands`); main.py assembles them."""
