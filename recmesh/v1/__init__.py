"""Generated protobuf/gRPC code for the recmesh.v1 contracts (proto/recmesh/v1).

Do not edit: regenerate with `make proto`.
"""
