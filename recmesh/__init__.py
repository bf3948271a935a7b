"""recmesh: a real-time recommendation serving mesh.

This package is the shared core every service uses: typed settings, telemetry,
resilience (deadlines, fallbacks), the error hierarchy, feature definitions and
the generated gRPC code (`recmesh.v1`). The services themselves live in
`services/<name>/`.
"""

__version__ = "0.1.0"

import os as _os

# NumPy's BLAS threads spin and fight the event loops for the same few cores:
# training took 37 s of CPU with them against 10 s without on the 2-core box,
# and the thread count can change float results (and so the model version
# hash). One thread per process unless the user says otherwise; this runs
# before any recmesh module imports NumPy.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

# gRPC's fork handlers restart its poller thread in a forked child. A child
# that closes inherited descriptors before exec (subprocess with preexec_fn, as
# recmesh.tools.localinfra starts every process of `recmesh up` and the tests) can then
# die on `epoll_wait: Bad file descriptor` before it runs anything
# (grpc/grpc#43055, grpcio >= 1.81): one child in ten while the parent's gRPC
# threads were busy, in a reproduction on this project's grpcio. recmesh never
# forks without exec, so it needs no fork support. This runs before any
# recmesh module imports grpc.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
