from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FeatureSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FEATURE_SOURCE_UNSPECIFIED: _ClassVar[FeatureSource]
    FEATURE_SOURCE_REALTIME: _ClassVar[FeatureSource]
    FEATURE_SOURCE_OFFLINE: _ClassVar[FeatureSource]
    FEATURE_SOURCE_DEFAULT: _ClassVar[FeatureSource]
FEATURE_SOURCE_UNSPECIFIED: FeatureSource
FEATURE_SOURCE_REALTIME: FeatureSource
FEATURE_SOURCE_OFFLINE: FeatureSource
FEATURE_SOURCE_DEFAULT: FeatureSource

class StringList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class CountMap(_message.Message):
    __slots__ = ("counts",)
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.ScalarMap[str, int]
    def __init__(self, counts: _Optional[_Mapping[str, int]] = ...) -> None: ...

class FeatureValue(_message.Message):
    __slots__ = ("number", "text", "strings", "counts", "source", "age_ms", "freshness")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    number: float
    text: str
    strings: StringList
    counts: CountMap
    source: FeatureSource
    age_ms: int
    freshness: float
    def __init__(self, number: _Optional[float] = ..., text: _Optional[str] = ..., strings: _Optional[_Union[StringList, _Mapping]] = ..., counts: _Optional[_Union[CountMap, _Mapping]] = ..., source: _Optional[_Union[FeatureSource, str]] = ..., age_ms: _Optional[int] = ..., freshness: _Optional[float] = ...) -> None: ...

class FeatureRow(_message.Message):
    __slots__ = ("entity_id", "features")
    class FeaturesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: FeatureValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[FeatureValue, _Mapping]] = ...) -> None: ...
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    features: _containers.MessageMap[str, FeatureValue]
    def __init__(self, entity_id: _Optional[str] = ..., features: _Optional[_Mapping[str, FeatureValue]] = ...) -> None: ...

class FeatureColumn(_message.Message):
    __slots__ = ("name", "numbers", "texts", "string_lists", "count_maps", "sources", "age_ms", "freshness")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMBERS_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    STRING_LISTS_FIELD_NUMBER: _ClassVar[int]
    COUNT_MAPS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    numbers: _containers.RepeatedScalarFieldContainer[float]
    texts: _containers.RepeatedScalarFieldContainer[str]
    string_lists: _containers.RepeatedCompositeFieldContainer[StringList]
    count_maps: _containers.RepeatedCompositeFieldContainer[CountMap]
    sources: _containers.RepeatedScalarFieldContainer[FeatureSource]
    age_ms: _containers.RepeatedScalarFieldContainer[int]
    freshness: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, name: _Optional[str] = ..., numbers: _Optional[_Iterable[float]] = ..., texts: _Optional[_Iterable[str]] = ..., string_lists: _Optional[_Iterable[_Union[StringList, _Mapping]]] = ..., count_maps: _Optional[_Iterable[_Union[CountMap, _Mapping]]] = ..., sources: _Optional[_Iterable[_Union[FeatureSource, str]]] = ..., age_ms: _Optional[_Iterable[int]] = ..., freshness: _Optional[_Iterable[float]] = ...) -> None: ...

class FeatureTable(_message.Message):
    __slots__ = ("entity_ids", "columns")
    ENTITY_IDS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    entity_ids: _containers.RepeatedScalarFieldContainer[str]
    columns: _containers.RepeatedCompositeFieldContainer[FeatureColumn]
    def __init__(self, entity_ids: _Optional[_Iterable[str]] = ..., columns: _Optional[_Iterable[_Union[FeatureColumn, _Mapping]]] = ...) -> None: ...

class ItemBlock(_message.Message):
    __slots__ = ("layout", "entity_ids", "columns", "values", "dictionaries", "lists")
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    ENTITY_IDS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DICTIONARIES_FIELD_NUMBER: _ClassVar[int]
    LISTS_FIELD_NUMBER: _ClassVar[int]
    layout: str
    entity_ids: _containers.RepeatedScalarFieldContainer[str]
    columns: _containers.RepeatedScalarFieldContainer[str]
    values: bytes
    dictionaries: _containers.RepeatedCompositeFieldContainer[BlockDictionary]
    lists: _containers.RepeatedCompositeFieldContainer[BlockList]
    def __init__(self, layout: _Optional[str] = ..., entity_ids: _Optional[_Iterable[str]] = ..., columns: _Optional[_Iterable[str]] = ..., values: _Optional[bytes] = ..., dictionaries: _Optional[_Iterable[_Union[BlockDictionary, _Mapping]]] = ..., lists: _Optional[_Iterable[_Union[BlockList, _Mapping]]] = ...) -> None: ...

class BlockDictionary(_message.Message):
    __slots__ = ("column", "values")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    column: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, column: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class BlockList(_message.Message):
    __slots__ = ("column", "offsets", "codes", "counts")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    column: str
    offsets: bytes
    codes: bytes
    counts: bytes
    def __init__(self, column: _Optional[str] = ..., offsets: _Optional[bytes] = ..., codes: _Optional[bytes] = ..., counts: _Optional[bytes] = ...) -> None: ...

class GetFeaturesRequest(_message.Message):
    __slots__ = ("user_id", "item_ids", "as_of_ms", "related_limit", "related_per_item", "items_only", "history_limit", "item_block")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_MS_FIELD_NUMBER: _ClassVar[int]
    RELATED_LIMIT_FIELD_NUMBER: _ClassVar[int]
    RELATED_PER_ITEM_FIELD_NUMBER: _ClassVar[int]
    ITEMS_ONLY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ITEM_BLOCK_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    as_of_ms: int
    related_limit: int
    related_per_item: int
    items_only: bool
    history_limit: int
    item_block: bool
    def __init__(self, user_id: _Optional[str] = ..., item_ids: _Optional[_Iterable[str]] = ..., as_of_ms: _Optional[int] = ..., related_limit: _Optional[int] = ..., related_per_item: _Optional[int] = ..., items_only: _Optional[bool] = ..., history_limit: _Optional[int] = ..., item_block: _Optional[bool] = ...) -> None: ...

class GetFeaturesResponse(_message.Message):
    __slots__ = ("user", "items", "feature_version", "as_of_ms", "degraded", "related", "related_included", "history", "history_included", "item_block")
    USER_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_VERSION_FIELD_NUMBER: _ClassVar[int]
    AS_OF_MS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    RELATED_FIELD_NUMBER: _ClassVar[int]
    RELATED_INCLUDED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_INCLUDED_FIELD_NUMBER: _ClassVar[int]
    ITEM_BLOCK_FIELD_NUMBER: _ClassVar[int]
    user: FeatureRow
    items: FeatureTable
    feature_version: str
    as_of_ms: int
    degraded: _containers.RepeatedScalarFieldContainer[str]
    related: _containers.RepeatedCompositeFieldContainer[ScoredItem]
    related_included: bool
    history: _containers.RepeatedScalarFieldContainer[str]
    history_included: bool
    item_block: ItemBlock
    def __init__(self, user: _Optional[_Union[FeatureRow, _Mapping]] = ..., items: _Optional[_Union[FeatureTable, _Mapping]] = ..., feature_version: _Optional[str] = ..., as_of_ms: _Optional[int] = ..., degraded: _Optional[_Iterable[str]] = ..., related: _Optional[_Iterable[_Union[ScoredItem, _Mapping]]] = ..., related_included: _Optional[bool] = ..., history: _Optional[_Iterable[str]] = ..., history_included: _Optional[bool] = ..., item_block: _Optional[_Union[ItemBlock, _Mapping]] = ...) -> None: ...

class GetPopularRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ScoredItem(_message.Message):
    __slots__ = ("item_id", "score")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    score: float
    def __init__(self, item_id: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class GetPopularResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoredItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoredItem, _Mapping]]] = ...) -> None: ...

class GetRelatedRequest(_message.Message):
    __slots__ = ("item_ids", "limit", "per_item")
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PER_ITEM_FIELD_NUMBER: _ClassVar[int]
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    per_item: int
    def __init__(self, item_ids: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ..., per_item: _Optional[int] = ...) -> None: ...

class GetRelatedResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoredItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoredItem, _Mapping]]] = ...) -> None: ...

class GetCategoryPopularRequest(_message.Message):
    __slots__ = ("categories", "limit")
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    categories: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    def __init__(self, categories: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ...) -> None: ...

class CategoryItems(_message.Message):
    __slots__ = ("category", "items")
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    category: str
    items: _containers.RepeatedCompositeFieldContainer[ScoredItem]
    def __init__(self, category: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ScoredItem, _Mapping]]] = ...) -> None: ...

class GetCategoryPopularResponse(_message.Message):
    __slots__ = ("categories",)
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    categories: _containers.RepeatedCompositeFieldContainer[CategoryItems]
    def __init__(self, categories: _Optional[_Iterable[_Union[CategoryItems, _Mapping]]] = ...) -> None: ...
