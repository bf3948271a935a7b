"""The `OTEL_*` variables that choose the trace exporters, the OTLP protocol and the sampler, checked."""

from __future__ import annotations

from collections.abc import Mapping

OTLP_PROTOCOLS = ("grpc", "http/protobuf")
TRACES_EXPORTERS = ("otlp", "console", "none")
SAMPLERS = ("always_on", "always_off", "traceidratio",
            "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio")  # fmt: skip


class TelemetryConfigError(ValueError):
    """An `OTEL_*` variable that recmesh cannot honour; the message names it."""


def sdk_disabled(env: Mapping[str, str]) -> bool:
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def traces_exporters(env: Mapping[str, str]) -> list[str]:
    """The exporters `OTEL_TRACES_EXPORTER` names (comma-separated; `none`
    for none). Unset, recmesh exports OTLP only when an OTLP endpoint is set
    (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`),
    where the SDK's default would send to localhost: a mesh started without a
    collector must not keep failing exports."""
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in TRACES_EXPORTERS]
    if unknown:
        raise TelemetryConfigError(
            f"OTEL_TRACES_EXPORTER: unsupported exporter {', '.join(unknown)}; use one or more of "
            f"{', '.join(TRACES_EXPORTERS)}"
        )
    return [] if "none" in names else list(dict.fromkeys(names))


def otlp_protocol(env: Mapping[str, str]) -> str:
    """The OTLP transport for traces: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`,
    else `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc`. The specification lets an
    SDK keep grpc as its default where grpc already was (OpenTelemetry Python's
    default, and recmesh's before it read the variable), so existing
    deployments that point at a collector's 4317 keep working."""
    for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(var, "").strip()
        if value:
            if value not in OTLP_PROTOCOLS:
                raise TelemetryConfigError(
                    f"{var}={value!r} is not supported; use one of {', '.join(OTLP_PROTOCOLS)}"
                )
            return value
    return "grpc"


def check_sampler(env: Mapping[str, str]) -> None:
    """Refuse a sampler the SDK would silently replace with its default."""
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if name and name not in SAMPLERS:
        raise TelemetryConfigError(f"OTEL_TRACES_SAMPLER={name!r} is not one of {', '.join(SAMPLERS)}")
    if name.endswith("traceidratio") and "OTEL_TRACES_SAMPLER_ARG" in env:
        arg = env["OTEL_TRACES_SAMPLER_ARG"]
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TelemetryConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio between 0 and 1")
