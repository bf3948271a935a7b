"""Features: the declared repository and the pure code that computes them.

`repository` reads a team's repository file (events, offline columns,
real-time aggregations, recall roles) into a FeatureSet, the one registry read
by the streaming path (services/feature), the online look-up and the offline
replay (`backfill`); `compute` holds the aggregations both share; `vectorize`
turns feature values into a model's input columns by declared transforms.
"""
