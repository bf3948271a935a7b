"""The feature service: real-time and offline features for one user and N items.

`store` owns the Redis state (writes from the ingest consumer, reads for
look-ups), `server` the gRPC FeatureService, `ingest` the Kafka consumer that
turns user_behavior events into state.
"""
