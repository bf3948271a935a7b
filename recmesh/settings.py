"""Typed settings for every process, read once from the environment.

Addresses follow one scheme: a service listens on `BIND_HOST:<SVC>_PORT` and
its clients dial `<SVC>_ADDR`. Settings that only recmesh knows carry a
`RECMESH_` prefix. Telemetry uses the standard `OTEL_*` variables (recmesh/telemetry/).
A bad value fails at start-up with pydantic's message naming the variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from recmesh.slo import SloClass, SloName, with_budgets

STATE_DIR_DEFAULT = Path(".recmesh")


def _default_shares() -> dict[SloName, float]:
    return {"A": 1.0, "B": 0.8, "C": 0.5}


def _default_floors() -> dict[SloName, int]:
    return {"A": 16}


def _default_queue() -> dict[SloName, int]:
    return {"A": 256, "B": 256, "C": 0}


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", populate_by_name=True)

    bind_host: str = "127.0.0.1"
    log_level: str = Field("INFO", validation_alias="RECMESH_LOG_LEVEL")
    log_format: Literal["json", "console"] = Field("json", validation_alias="RECMESH_LOG_FORMAT")
    # Seconds a stopping server gives in-flight RPCs before cancelling them.
    shutdown_grace_s: float = Field(3.0, validation_alias="RECMESH_SHUTDOWN_GRACE_S")
    # Seconds a stopping process spends at most exporting its queued spans
    # (recmesh.telemetry.Tracing.shutdown); what is left is dropped and counted.
    telemetry_flush_s: float = Field(1.0, ge=0.0, validation_alias="RECMESH_TELEMETRY_FLUSH_S")
    # End-to-end budget per SLO class in ms over the defaults (A 300, B 850,
    # C 3000), e.g. '{"A": 200}'. The gateway turns it into the deadline and the
    # ranker plans its stages against it: give both the same value.
    slo_budgets_ms: dict[SloName, int] = Field(
        default_factory=dict, validation_alias="RECMESH_SLO_BUDGETS_MS"
    )
    # The feature repository file (recmesh.toml, docs/features.md) every
    # process serves; unset: the demo's, next to a source checkout.
    repository: Path | None = Field(None, validation_alias="RECMESH_REPOSITORY")

    @field_validator("slo_budgets_ms")
    @classmethod
    def _valid_budgets(cls, value: dict[SloName, int]) -> dict[SloName, int]:
        with_budgets(value)  # raises on a budget <= 0
        return value


def configured_classes() -> dict[str, SloClass]:
    """The SLO classes with this environment's budgets (RECMESH_SLO_BUDGETS_MS):
    for tools outside the services, such as the benchmarks' goodput."""
    return with_budgets(CommonSettings().slo_budgets_ms)


class RedisSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", populate_by_name=True)

    redis_url: str = "redis://127.0.0.1:6380/0"
    redis_max_connections: int = Field(32, validation_alias="RECMESH_REDIS_MAX_CONNECTIONS")


class KafkaSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", populate_by_name=True)

    kafka_bootstrap: str = "127.0.0.1:9092"
    events_topic: str = Field("user_behavior", validation_alias="RECMESH_EVENTS_TOPIC")
    dlq_topic: str = Field("user_behavior.dlq", validation_alias="RECMESH_DLQ_TOPIC")


class FeatureSettings(CommonSettings, RedisSettings, KafkaSettings):
    feature_port: int = 50052
    metrics_port: int = Field(9102, validation_alias="FEATURE_METRICS_PORT")
    # Budget for the real-time read; past it the response falls back to
    # offline features only (design notes: Redis read timeout 50 ms).
    realtime_timeout_ms: float = Field(50.0, validation_alias="RECMESH_FEATURE_TIMEOUT_MS")
    # Per SLO class overrides, e.g. RECMESH_FEATURE_TIMEOUT_MS_BY_CLASS='{"A": 30, "C": 200}'.
    realtime_timeout_ms_by_class: dict[str, float] = Field(
        default_factory=dict, validation_alias="RECMESH_FEATURE_TIMEOUT_MS_BY_CLASS"
    )
    max_items: int = Field(500, validation_alias="RECMESH_FEATURE_MAX_ITEMS")
    # Items' real-time reads held in process (services/feature/item_cache.py): served
    # again while the ingest reports no event for the item and for at most this long
    # (an event sliding out of a window in that time is what it may miss); 0 = off.
    item_cache_ms: int = Field(500, ge=0, le=60_000, validation_alias="RECMESH_ITEM_CACHE_MS")
    # Served-feature log (services/feature/served_log.py): the share of look-ups whose
    # served vectors go to the topic (0 = off, 1 = all), and the queue bound past
    # which records are dropped rather than slowing look-ups.
    served_log_rate: float = Field(0.01, ge=0.0, le=1.0, validation_alias="RECMESH_SERVED_LOG_RATE")
    served_topic: str = Field("served_features", validation_alias="RECMESH_SERVED_TOPIC")
    served_log_queue: int = Field(1000, ge=1, validation_alias="RECMESH_SERVED_LOG_QUEUE")


class IngestSettings(CommonSettings, RedisSettings, KafkaSettings):
    metrics_port: int = Field(9105, validation_alias="INGEST_METRICS_PORT")
    consumer_group: str = Field("recmesh-feature-ingest", validation_alias="RECMESH_CONSUMER_GROUP")
    max_batch: int = Field(2000, validation_alias="RECMESH_INGEST_MAX_BATCH")
    # How long a fetch may wait at the broker for records (Kafka's fetch.max.wait.ms; aiokafka's
    # default is 500). The embedded Tansu broker answers a fetch when the wait is over, not when
    # a record arrives: at 500 ms, freshness p99 was 475 ms; at 50 ms, 114 ms (bench features).
    fetch_max_wait_ms: int = Field(50, ge=0, validation_alias="RECMESH_INGEST_FETCH_MAX_WAIT_MS")
    # The same once no record has come for a second (recmesh.consumer.FetchWait): an idle
    # mesh's empty fetches were most of its CPU; the first event after a quiet second is
    # applied up to this much later. At most fetch_max_wait_ms: never stretched.
    idle_fetch_max_wait_ms: int = Field(250, ge=0, validation_alias="RECMESH_INGEST_IDLE_FETCH_MAX_WAIT_MS")
    allowed_lateness_ms: int = Field(10_000, validation_alias="RECMESH_ALLOWED_LATENESS_MS")
    # State-drift sampler: a pass over the keyspace every this many seconds (0 = off),
    # scanning at most this many keys per second (services/feature/drift.py).
    state_sample_s: float = Field(15.0, validation_alias="RECMESH_STATE_SAMPLE_S")
    state_scan_keys_per_s: int = Field(20_000, validation_alias="RECMESH_STATE_SCAN_KEYS_PER_S")


class AttributionSettings(CommonSettings, RedisSettings, KafkaSettings):
    """The attribution consumer (services/attribution): impressions + events -> online figures."""

    metrics_port: int = Field(9106, validation_alias="ATTRIBUTION_METRICS_PORT")
    consumer_group: str = Field("recmesh-attribution", validation_alias="RECMESH_ATTRIBUTION_GROUP")
    impressions_topic: str = Field("impressions", validation_alias="RECMESH_IMPRESSIONS_TOPIC")
    max_batch: int = Field(1000, ge=1, validation_alias="RECMESH_ATTRIBUTION_MAX_BATCH")
    # Larger batches, fewer round trips: attribution is not on any request's path.
    fetch_max_wait_ms: int = Field(500, ge=0, validation_alias="RECMESH_ATTRIBUTION_FETCH_MAX_WAIT_MS")
    # A partition that brought nothing for this long stops holding the clock back;
    # when every one is idle, the clock runs on with the wall clock.
    idle_ms: int = Field(10_000, ge=100, validation_alias="RECMESH_ATTRIBUTION_IDLE_MS")
    # How long an answer not yet final is kept past its window and lateness (the
    # longest the consumer may stop without losing it), and how long a final
    # answer's id is remembered so that a redelivered impression adds nothing.
    grace_s: int = Field(3600, ge=60, validation_alias="RECMESH_ATTRIBUTION_GRACE_S")
    # The declared [evaluation.guard] acts (on) or is left alone, figures only (off).
    guard: bool = Field(True, validation_alias="RECMESH_GUARD")
    # How long the per-minute sums are kept (`recmesh eval online --window`).
    retention_s: int = Field(7 * 86400, ge=3600, validation_alias="RECMESH_ATTRIBUTION_RETENTION_S")
    # Where the guard (services/attribution/guard.py) reads ctr/EXPERIMENT and, deciding,
    # writes it and ctr/CURRENT: the inference service's model directory, shared.
    model_dir: Path = Field(STATE_DIR_DEFAULT / "models", validation_alias="RECMESH_MODEL_DIR")


class InferenceSettings(CommonSettings):
    inference_port: int = 50053
    metrics_port: int = Field(9103, validation_alias="INFERENCE_METRICS_PORT")
    model_dir: Path = Field(STATE_DIR_DEFAULT / "models", validation_alias="RECMESH_MODEL_DIR")
    intra_op_threads: int = Field(1, validation_alias="RECMESH_ORT_THREADS")
    max_rows: int = Field(2000, validation_alias="RECMESH_INFERENCE_MAX_ROWS")
    batching: bool = Field(True, validation_alias="RECMESH_INFERENCE_BATCHING")
    batch_max_rows: int = Field(1024, validation_alias="RECMESH_BATCH_MAX_ROWS")
    batch_max_delay_us: int = Field(500, validation_alias="RECMESH_BATCH_MAX_DELAY_US")
    batch_max_queue: int = Field(256, validation_alias="RECMESH_BATCH_MAX_QUEUE")
    # A request of this many rows or more is scored alone, without waiting: on CPU a
    # level-0 run of 64 rows costs 61.5 us alone and 56.9 us per request in a batch of
    # 16, of 128 rows 107 us alone and 110 us batched (services/inference/batcher.py).
    batch_solo_rows: int = Field(100, ge=1, validation_alias="RECMESH_BATCH_SOLO_ROWS")
    # Queue depth from which callers are told to degrade (trailing metadata).
    batch_queue_threshold: int = Field(128, validation_alias="RECMESH_BATCH_QUEUE_THRESHOLD")
    # Text models (Embed / Generate), each in its own lane: a concurrency limit
    # (= worker threads) and a bounded wait queue, separate from Score.
    text_backend: Literal["auto", "onnx", "vllm"] = Field("auto", validation_alias="RECMESH_TEXT_BACKEND")
    embed_concurrency: int = Field(1, ge=1, validation_alias="RECMESH_EMBED_CONCURRENCY")
    embed_max_queue: int = Field(8, ge=0, validation_alias="RECMESH_EMBED_MAX_QUEUE")
    embed_max_texts: int = Field(64, ge=1, validation_alias="RECMESH_EMBED_MAX_TEXTS")
    embed_max_chars: int = Field(8000, ge=1, validation_alias="RECMESH_EMBED_MAX_CHARS")
    embed_ort_threads: int = Field(1, ge=1, validation_alias="RECMESH_EMBED_ORT_THREADS")
    # Niceness of the text lanes' threads: Score (class A's path) gets the CPU first.
    text_nice: int = Field(19, ge=0, le=19, validation_alias="RECMESH_TEXT_NICE")
    generate_concurrency: int = Field(4, ge=1, validation_alias="RECMESH_GENERATE_CONCURRENCY")
    generate_max_queue: int = Field(16, ge=0, validation_alias="RECMESH_GENERATE_MAX_QUEUE")
    # Local directory of generative weights for vLLM (no hub downloads); None: no generation.
    generation_model_dir: Path | None = Field(None, validation_alias="RECMESH_GENERATION_MODEL_DIR")
    vllm_gpu_memory_utilization: float = Field(0.8, validation_alias="RECMESH_VLLM_GPU_MEMORY_UTILIZATION")


class RankerSettings(CommonSettings):
    ranker_port: int = 50054
    metrics_port: int = Field(9104, validation_alias="RANKER_METRICS_PORT")
    feature_addr: str = "127.0.0.1:50052"
    inference_addr: str = "127.0.0.1:50053"
    # Candidates pulled from recall before scoring.
    candidates: int = Field(200, validation_alias="RECMESH_RANKER_CANDIDATES")
    # Time kept back from every downstream call so this hop can still answer.
    hop_margin_ms: float = Field(5.0, validation_alias="RECMESH_HOP_MARGIN_MS")
    # Rank calls in flight the ranker counts as full load: from 70 % of it the
    # degradation ladder steps down (resilience.load_band).
    capacity: int = Field(48, gt=0, validation_alias="RECMESH_RANKER_CAPACITY")
    # --- recall fusion (services/ranker/fusion.py) ---
    # Base weight per recall source, before the hybrid rule shifts them by sigma, e.g.
    # RECMESH_RANKER_FUSION_WEIGHTS='{"popular": 0.1, "covisit": 0.35, "category": 0.45, "semantic": 0.2}'.
    # The learnt sources' weights (knn, ease, similar, vectors, revisit; and popular) come from the
    # current recall version's card (learnt with its tables) unless named here.
    fusion_weights: dict[str, float] = Field(
        default_factory=lambda: {
            "popular": 0.10,
            "covisit": 0.35,
            "category": 0.45,
            "semantic": 0.20,
            "knn": 1.0,
            "ease": 1.0,
            "sequence": 1.0,
            "similar": 1.0,
            "vectors": 1.0,
            "revisit": 1.0,
        },
        validation_alias="RECMESH_RANKER_FUSION_WEIGHTS",
    )
    # Candidates each recall source returns (the fused list is cut to `candidates`).
    recall_per_source: int = Field(100, gt=0, le=1000, validation_alias="RECMESH_RANKER_RECALL_PER_SOURCE")
    # The final order: the model's order plus this weight times the recall order,
    # both as reciprocal ranks (services/ranker/policy.py blend_orders); 0 = the
    # model's. Unset: the current learnt recall version's (its card), 0 without one.
    recall_blend: float | None = Field(None, ge=0.0, validation_alias="RECMESH_RANKER_RECALL_BLEND")
    # How long the popularity and category recall lists are reused (0: never; the
    # ranking evaluation runs with 0 so two runs give the same figures).
    recall_cache_s: float = Field(5.0, ge=0.0, validation_alias="RECMESH_RANKER_RECALL_CACHE_S")
    # Ask the feature service for the candidates' features as one packed block
    # (recmesh/features/block.py) and forward it to inference as it is; false:
    # the per-feature message form (FeatureTable), decoded and re-encoded here.
    item_block: bool = Field(True, validation_alias="RECMESH_RANKER_ITEM_BLOCK")
    # How many of the user's categories the affinity source draws from.
    affinity_categories: int = Field(3, gt=0, validation_alias="RECMESH_RANKER_AFFINITY_CATEGORIES")
    # Diversity: at most this many items of one category in an answer (0 = no cap).
    max_per_category: int = Field(3, ge=0, validation_alias="RECMESH_RANKER_MAX_PER_CATEGORY")
    # The ranking graph (TOML, see services/ranker/graph.py); unset: the shipped default.
    pipeline_graph: Path | None = Field(None, validation_alias="RECMESH_RANKER_PIPELINE")
    # Where the item vectors for the semantic source live (MODEL_DIR/item_vectors).
    model_dir: Path = Field(STATE_DIR_DEFAULT / "models", validation_alias="RECMESH_MODEL_DIR")


class ApiKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str
    max_class: Literal["A", "B", "C"] = "B"
    trusted_context: bool = False


class AdmissionSettings(BaseSettings):
    """Per-class admission at the gateway and the controller that tunes it."""

    model_config = SettingsConfigDict(extra="forbid", populate_by_name=True)

    enabled: bool = Field(True, validation_alias="RECMESH_ADMISSION")
    initial_limit: float = Field(32, gt=0, validation_alias="RECMESH_ADMISSION_INITIAL_LIMIT")
    min_limit: float = Field(8, gt=0, validation_alias="RECMESH_ADMISSION_MIN_LIMIT")
    max_limit: float = Field(256, gt=0, validation_alias="RECMESH_ADMISSION_MAX_LIMIT")
    latency_target_ms: float = Field(100.0, gt=0, validation_alias="RECMESH_ADMISSION_LATENCY_TARGET_MS")
    # Share of the limit each class may fill, e.g. '{"A": 1.0, "B": 0.8, "C": 0.5}'.
    shares: dict[SloName, float] = Field(
        default_factory=_default_shares,
        validation_alias="RECMESH_ADMISSION_SHARES",
    )
    # In-flight slots a class keeps whatever the adaptive limit, e.g. '{"A": 16}'.
    floors: dict[SloName, int] = Field(
        default_factory=_default_floors, validation_alias="RECMESH_ADMISSION_FLOORS"
    )
    # Requests per class that may wait for a slot, e.g. '{"A": 256, "B": 256, "C": 0}': a bound on
    # what the waiting room holds (how long one waits is RECMESH_ADMISSION_QUEUE_WAIT's bound).
    queue: dict[SloName, int] = Field(
        default_factory=_default_queue,
        validation_alias="RECMESH_ADMISSION_QUEUE",
    )
    retry_after_s: int = Field(1, ge=0, validation_alias="RECMESH_ADMISSION_RETRY_AFTER_S")
    # Gateway event-loop lag past which class C is shed (B past twice it); 0: off.
    loop_lag_limit_ms: float = Field(25.0, ge=0, validation_alias="RECMESH_ADMISSION_LOOP_LAG_MS")
    # A queued request waits at most this share of its budget for a slot.
    queue_wait_fraction: float = Field(0.5, gt=0, le=1, validation_alias="RECMESH_ADMISSION_QUEUE_WAIT")
    # The feedback controller: window length (0 turns it off), class A's P95 target,
    # and the range it may move the latency target in.
    controller_window_s: float = Field(10.0, ge=0, validation_alias="RECMESH_CONTROLLER_WINDOW_S")
    target_p95_ms: float = Field(200.0, gt=0, validation_alias="RECMESH_CONTROLLER_TARGET_P95_MS")
    controller_min_ms: float = Field(50.0, gt=0, validation_alias="RECMESH_CONTROLLER_MIN_MS")
    controller_max_ms: float = Field(1000.0, gt=0, validation_alias="RECMESH_CONTROLLER_MAX_MS")


def _default_tool_queue() -> dict[SloName, int]:
    return {"A": 8, "B": 8, "C": 0}


class AiToolSettings(BaseSettings):
    """The gateway's AI-tool endpoints (/v2/ai-tool/*): their own admission gate
    (a fixed concurrency limit and per-class queues, apart from /v1/recommend),
    input limits and the generation fuse."""

    model_config = SettingsConfigDict(extra="forbid", populate_by_name=True)

    concurrency: int = Field(4, ge=1, validation_alias="RECMESH_AI_TOOL_CONCURRENCY")
    queue: dict[SloName, int] = Field(
        default_factory=_default_tool_queue, validation_alias="RECMESH_AI_TOOL_QUEUE"
    )
    max_text_chars: int = Field(20_000, ge=1, validation_alias="RECMESH_AI_TOOL_MAX_TEXT_CHARS")
    max_sentences: int = Field(64, ge=1, validation_alias="RECMESH_AI_TOOL_MAX_SENTENCES")
    max_context_chars: int = Field(4_000, ge=1, validation_alias="RECMESH_AI_TOOL_MAX_CONTEXT_CHARS")
    # An LLM call past this falls back (design notes: 5 s), never past the class budget.
    generation_timeout_ms: float = Field(
        5_000, gt=0, validation_alias="RECMESH_AI_TOOL_GENERATION_TIMEOUT_MS"
    )
    max_output_tokens: int = Field(256, ge=1, validation_alias="RECMESH_AI_TOOL_MAX_OUTPUT_TOKENS")


class GatewaySettings(CommonSettings, KafkaSettings):
    gateway_http_port: int = 8000
    gateway_grpc_port: int = 50051
    # /metrics (with tenant labels) off the public port, where the other services serve theirs.
    metrics_port: int = Field(9101, validation_alias="GATEWAY_METRICS_PORT")
    ranker_addr: str = "127.0.0.1:50054"
    feature_addr: str = "127.0.0.1:50052"
    inference_addr: str = "127.0.0.1:50053"
    default_slo_class: Literal["A", "B", "C"] = Field("B", validation_alias="RECMESH_DEFAULT_SLO_CLASS")
    # API key -> {"tenant": ..., "max_class": "A"|"B"|"C", "trusted_context": bool}, as JSON.
    api_keys: dict[str, ApiKey] = Field(default_factory=dict, validation_alias="RECMESH_API_KEYS")
    # The most a request without a (known) key may get.
    anonymous_max_class: Literal["A", "B", "C"] = Field("B", validation_alias="RECMESH_ANONYMOUS_MAX_CLASS")
    hop_margin_ms: float = Field(5.0, validation_alias="RECMESH_HOP_MARGIN_MS")
    # Downstreams that may be scaled to zero: /readyz does not probe them (a
    # probe would count as traffic and keep them warm, and fail while cold).
    may_be_cold: list[str] = Field(default_factory=list, validation_alias="RECMESH_MAY_BE_COLD")
    # How long a request of class B or C waits for a presumed-cold dependency
    # before taking its fallback (services/gateway/cold.py). Class A has no
    # entry on purpose: it never waits for a cold dependency.
    cold_wait_s_by_class: dict[Literal["B", "C"], float] = Field(
        default_factory=lambda: {"B": 0.5, "C": 2.5},  # type: ignore[arg-type, unused-ignore]
        validation_alias="RECMESH_COLD_WAIT_S_BY_CLASS",
    )
    # A may-be-cold dependency not seen serving for this long is presumed cold
    # (Knative keeps a revision at least window + scale-down delay after traffic).
    cold_after_s: float = Field(60.0, gt=0, validation_alias="RECMESH_COLD_AFTER_S")
    # Budget a request keeps back, after a cold wait, for the rest of its path.
    cold_reserve_ms: float = Field(150.0, ge=0, validation_alias="RECMESH_COLD_RESERVE_MS")
    # Bound of the background wake-up a class-A fallback starts.
    cold_wake_timeout_s: float = Field(30.0, gt=0, validation_alias="RECMESH_COLD_WAKE_TIMEOUT_S")
    max_count: int = Field(100, ge=1, le=500, validation_alias="RECMESH_MAX_COUNT")  # the ranker caps at 500
    max_events_per_request: int = Field(1000, validation_alias="RECMESH_MAX_EVENTS_PER_REQUEST")
    # The impression log (services/gateway/impressions.py): every answered recommendation
    # at rate 1 (attribution joins clicks to what was shown: a sampled log would lose the
    # clicks on unlogged answers), to this topic; past the queue bound, dropped and counted.
    impressions_topic: str = Field("impressions", validation_alias="RECMESH_IMPRESSIONS_TOPIC")
    impression_log_rate: float = Field(1.0, ge=0.0, le=1.0, validation_alias="RECMESH_IMPRESSION_LOG_RATE")
    impression_log_queue: int = Field(10_000, ge=1, validation_alias="RECMESH_IMPRESSION_LOG_QUEUE")
    # How long the log gathers impressions into one send: the online figures see an
    # answer up to this much later, and the gateway, the broker and the attribution
    # consumer handle one batch per this many ms instead of one per answer.
    impression_log_linger_ms: int = Field(
        100, ge=0, le=10_000, validation_alias="RECMESH_IMPRESSION_LOG_LINGER_MS"
    )
    produce_timeout_s: float = Field(5.0, validation_alias="RECMESH_PRODUCE_TIMEOUT_S")
    # Overload protection (recmesh/admission.py, recmesh/controller.py).
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    ai_tool: AiToolSettings = Field(default_factory=AiToolSettings)


class StateSettings(BaseSettings):
    """Where `recmesh up` keeps its state (certificates, logs, models), which is
    also where the CLI looks for the mesh's credentials (CliSettings)."""

    model_config = SettingsConfigDict(extra="forbid", populate_by_name=True)

    state_dir: Path = Field(STATE_DIR_DEFAULT, validation_alias="RECMESH_STATE_DIR")


class CliSettings(StateSettings):
    """What the CLI reads at start-up, before any command (recmesh/tools/cli/clienv.py)."""

    # The file the CLI takes the mesh's credentials and addresses from: unset,
    # <state dir>/secrets/cli.env when `recmesh up` wrote one; `off`, none.
    cli_env: str | None = Field(None, validation_alias="RECMESH_CLI_ENV")


class UpSettings(CommonSettings, StateSettings):
    """`recmesh up`: where the embedded parts listen and which external ones to use."""

    redis_url: str | None = None  # set -> use this Redis instead of starting one
    kafka_bootstrap: str | None = None  # set -> use this broker instead of starting one
    embedded_redis_port: int = Field(6380, validation_alias="RECMESH_REDIS_PORT")
    embedded_kafka_port: int = Field(9092, validation_alias="RECMESH_KAFKA_PORT")
    # How the embedded Redis keeps its data in <state>/redis (localinfra.REDIS_PERSISTENCE):
    # snapshots (rdb: nothing on the write path), an append-only file (aof: crash-safe
    # to a second, at a cost per write), or nothing (off).
    redis_persistence: Literal["rdb", "aof", "off"] = Field(
        "rdb", validation_alias="RECMESH_REDIS_PERSISTENCE"
    )
    model_dir: Path | None = Field(None, validation_alias="RECMESH_MODEL_DIR")
    events_topic: str = Field("user_behavior", validation_alias="RECMESH_EVENTS_TOPIC")
    dlq_topic: str = Field("user_behavior.dlq", validation_alias="RECMESH_DLQ_TOPIC")
    served_topic: str = Field("served_features", validation_alias="RECMESH_SERVED_TOPIC")
    impressions_topic: str = Field("impressions", validation_alias="RECMESH_IMPRESSIONS_TOPIC")
    topic_partitions: int = Field(3, validation_alias="RECMESH_TOPIC_PARTITIONS")
    gateway_http_port: int = 8000
    gateway_grpc_port: int = 50051
    feature_port: int = 50052
    inference_port: int = 50053
    ranker_port: int = 50054
    gateway_metrics_port: int = 9101
    feature_metrics_port: int = 9102
    inference_metrics_port: int = 9103
    ranker_metrics_port: int = 9104
    ingest_metrics_port: int = 9105
    attribution_metrics_port: int = 9106
    ready_timeout_s: float = Field(90.0, validation_alias="RECMESH_READY_TIMEOUT_S")
