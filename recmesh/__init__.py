"""recmesh: a real-time recommendation serving mesh.

This package is the shared core every service uses: typed settings, telemetry,
resilience (deadlines, fallbacks), the error hierarchy, feature definitions and
the generated gRPC code (`recmesh.v1`). The services themselves live in
`services/<name>/`.
"""

__version__ = "0.1.0"
