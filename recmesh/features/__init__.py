"""Feature definitions and the pure code that computes them.

`definitions` is the one registry (name, entity, type, window, TTL, default,
version) read by the streaming path (services/feature), the online look-up and
the offline replay (`backfill`); `compute` holds the window logic both share;
`vectorize` turns feature rows into the model's input columns.
"""
