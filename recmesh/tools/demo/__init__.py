"""Demo catalog, users and behaviour with a documented structure (see generate.py)."""
