from recmesh.v1 import features_pb2 as _features_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankRequest(_message.Message):
    __slots__ = ("user_id", "count", "context", "as_of_ms")
    class ContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    AS_OF_MS_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    count: int
    context: _containers.ScalarMap[str, str]
    as_of_ms: int
    def __init__(self, user_id: _Optional[str] = ..., count: _Optional[int] = ..., context: _Optional[_Mapping[str, str]] = ..., as_of_ms: _Optional[int] = ...) -> None: ...

class RankResponse(_message.Message):
    __slots__ = ("items", "model_version", "feature_version", "degraded", "recall_counts", "sigma", "arm", "shadow_scores", "shadow_model_version")
    class RecallCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    RECALL_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    SHADOW_SCORES_FIELD_NUMBER: _ClassVar[int]
    SHADOW_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_features_pb2.ScoredItem]
    model_version: str
    feature_version: str
    degraded: _containers.RepeatedScalarFieldContainer[str]
    recall_counts: _containers.ScalarMap[str, int]
    sigma: float
    arm: str
    shadow_scores: _containers.RepeatedScalarFieldContainer[float]
    shadow_model_version: str
    def __init__(self, items: _Optional[_Iterable[_Union[_features_pb2.ScoredItem, _Mapping]]] = ..., model_version: _Optional[str] = ..., feature_version: _Optional[str] = ..., degraded: _Optional[_Iterable[str]] = ..., recall_counts: _Optional[_Mapping[str, int]] = ..., sigma: _Optional[float] = ..., arm: _Optional[str] = ..., shadow_scores: _Optional[_Iterable[float]] = ..., shadow_model_version: _Optional[str] = ...) -> None: ...
