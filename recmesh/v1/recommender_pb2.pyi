from recmesh.v1 import features_pb2 as _features_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecommendRequest(_message.Message):
    __slots__ = ("user_id", "count", "context")
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
    user_id: str
    count: int
    context: _containers.ScalarMap[str, str]
    def __init__(self, user_id: _Optional[str] = ..., count: _Optional[int] = ..., context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RecommendResponse(_message.Message):
    __slots__ = ("items", "slo_class", "trace_id", "model_version", "feature_version", "degraded", "request_id")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_features_pb2.ScoredItem]
    slo_class: str
    trace_id: str
    model_version: str
    feature_version: str
    degraded: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, items: _Optional[_Iterable[_Union[_features_pb2.ScoredItem, _Mapping]]] = ..., slo_class: _Optional[str] = ..., trace_id: _Optional[str] = ..., model_version: _Optional[str] = ..., feature_version: _Optional[str] = ..., degraded: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...
