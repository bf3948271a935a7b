"""Typed clients for the mesh's gRPC services, one small method per RPC.

`base` holds what every client shares (the channel, retries, circuit breaker,
hedging, deadlines from the request budget, error translation); `feature`,
`inference` and `ranker` hold one client each. Import each name from the module
that defines it.
"""
