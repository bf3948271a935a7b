"""The gateway: the mesh's public edge, REST (FastAPI) and gRPC.

`edge` turns every transport's request into its caller (granted class),
budget scope and admission slot, and every error into its HTTP and gRPC
answer; `recommend` is the one recommendation path both transports call
(ranker, with a popularity fallback); `event_publisher` publishes behaviour
events to Kafka; `ai_tool_calls` runs the AI-tool calls and `ai_tool_routes`
serves them at /v2/ai-tool/*; `app` is the FastAPI application; `grpc_api`
the public `recmesh.v1.Recommender` service.
"""
