"""The recmesh error hierarchy.

Each error knows its gRPC status code and HTTP status, so transports translate
it once at their boundary: the gRPC server interceptor (grpcserver.py), the
gateway's exception handler, and the client wrappers (recmesh/clients/base.py), which turn
`grpc.aio.AioRpcError` back into these classes.
"""

from __future__ import annotations

import grpc


class RecmeshError(Exception):
    """Base class; `str(err)` is the message shown to callers."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: int = 500


class InvalidArgument(RecmeshError):
    """The caller sent something malformed; the message names the field."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class Unprocessable(InvalidArgument):
    """Well-formed, but what it asks cannot be produced (e.g. an output schema no
    generator can satisfy, or a token budget smaller than the request needs)."""

    http_status = 422


class Unauthenticated(RecmeshError):
    """An API key was sent but is not known."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class NotFound(RecmeshError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class FailedPrecondition(RecmeshError):
    """The request is well formed but cannot be served as is (e.g. schema mismatch).
    400, as google.rpc.Code maps FAILED_PRECONDITION (409 is ABORTED's)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 400


class ResourceExhausted(RecmeshError):
    """Shed for overload; callers may retry after `retry_after_s` (Retry-After)."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(RecmeshError):
    """A dependency could not be reached."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503


class CircuitOpen(Unavailable):
    """The client's circuit breaker for this downstream is open: not even tried."""


class DeadlineExceeded(RecmeshError):
    """The request's budget ran out before the work could be done."""

    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504


_BY_GRPC_CODE: dict[grpc.StatusCode, type[RecmeshError]] = {
    cls.grpc_code: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        NotFound,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
    )
}


def from_grpc(code: grpc.StatusCode, details: str | None) -> RecmeshError:
    """Translate a gRPC status received from a downstream into our hierarchy."""
    cls = _BY_GRPC_CODE.get(code, RecmeshError)
    return cls(details or code.name)
