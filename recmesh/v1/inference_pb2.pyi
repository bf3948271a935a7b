from recmesh.v1 import features_pb2 as _features_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("feature_version", "feature_names", "values", "level", "values_f32", "user", "items", "item_block")
    FEATURE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    VALUES_F32_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ITEM_BLOCK_FIELD_NUMBER: _ClassVar[int]
    feature_version: str
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedScalarFieldContainer[float]
    level: int
    values_f32: bytes
    user: _features_pb2.FeatureRow
    items: _features_pb2.FeatureTable
    item_block: _features_pb2.ItemBlock
    def __init__(self, feature_version: _Optional[str] = ..., feature_names: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[float]] = ..., level: _Optional[int] = ..., values_f32: _Optional[bytes] = ..., user: _Optional[_Union[_features_pb2.FeatureRow, _Mapping]] = ..., items: _Optional[_Union[_features_pb2.FeatureTable, _Mapping]] = ..., item_block: _Optional[_Union[_features_pb2.ItemBlock, _Mapping]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "model_version", "level", "arm", "shadow_scores", "shadow_model_version")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    SHADOW_SCORES_FIELD_NUMBER: _ClassVar[int]
    SHADOW_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    model_version: str
    level: int
    arm: str
    shadow_scores: _containers.RepeatedScalarFieldContainer[float]
    shadow_model_version: str
    def __init__(self, scores: _Optional[_Iterable[float]] = ..., model_version: _Optional[str] = ..., level: _Optional[int] = ..., arm: _Optional[str] = ..., shadow_scores: _Optional[_Iterable[float]] = ..., shadow_model_version: _Optional[str] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfoResponse(_message.Message):
    __slots__ = ("model_version", "feature_version", "feature_names", "execution_provider", "origin", "features_read")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_READ_FIELD_NUMBER: _ClassVar[int]
    model_version: str
    feature_version: str
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    execution_provider: str
    origin: str
    features_read: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_version: _Optional[str] = ..., feature_version: _Optional[str] = ..., feature_names: _Optional[_Iterable[str]] = ..., execution_provider: _Optional[str] = ..., origin: _Optional[str] = ..., features_read: _Optional[_Iterable[str]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("texts",)
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, texts: _Optional[_Iterable[str]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("values", "dim", "model", "backend", "tokens")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    dim: int
    model: str
    backend: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[float]] = ..., dim: _Optional[int] = ..., model: _Optional[str] = ..., backend: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "max_tokens", "json_schema")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    max_tokens: int
    json_schema: str
    def __init__(self, prompt: _Optional[str] = ..., max_tokens: _Optional[int] = ..., json_schema: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "model", "backend", "prompt_tokens", "completion_tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    model: str
    backend: str
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, text: _Optional[str] = ..., model: _Optional[str] = ..., backend: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class CapabilitiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CapabilitiesResponse(_message.Message):
    __slots__ = ("embedding_model", "embedding_backend", "generation_model", "generation_backend")
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_BACKEND_FIELD_NUMBER: _ClassVar[int]
    GENERATION_MODEL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    embedding_model: str
    embedding_backend: str
    generation_model: str
    generation_backend: str
    def __init__(self, embedding_model: _Optional[str] = ..., embedding_backend: _Optional[str] = ..., generation_model: _Optional[str] = ..., generation_backend: _Optional[str] = ...) -> None: ...
