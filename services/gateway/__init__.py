"""The gateway: the mesh's public edge, REST (FastAPI) and gRPC.

`recommend` is the one recommendation path both transports call (SLO class ->
deadline -> ranker, with a popularity fallback); `events` publishes behaviour
events to Kafka; `app` is the FastAPI application; `grpc_api` the public
`recmesh.v1.Recommender` service.
"""
