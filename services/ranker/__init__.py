"""The ranker: candidates -> features -> scores -> final order for one user.

`policy` holds the pure ordering rules, `pipeline` the stages and their
fallbacks, `server` the gRPC RankerService.
"""
