from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("feature_version", "feature_names", "values", "level")
    FEATURE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    feature_version: str
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedScalarFieldContainer[float]
    level: int
    def __init__(self, feature_version: _Optional[str] = ..., feature_names: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[float]] = ..., level: _Optional[int] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "model_version", "level")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    model_version: str
    level: int
    def __init__(self, scores: _Optional[_Iterable[float]] = ..., model_version: _Optional[str] = ..., level: _Optional[int] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfoResponse(_message.Message):
    __slots__ = ("model_version", "feature_version", "feature_names", "execution_provider")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    model_version: str
    feature_version: str
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    execution_provider: str
    def __init__(self, model_version: _Optional[str] = ..., feature_version: _Optional[str] = ..., feature_names: _Optional[_Iterable[str]] = ..., execution_provider: _Optional[str] = ...) -> None: ...
