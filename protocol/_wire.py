"""Dataclass <-> wire map conversion, driven by the events' type hints.

The wire map is what JSON and msgpack carry: ``dict``/``list``/``str``/
``int``/``float``/``bool``/``None`` (a :class:`JsonText` field: any JSON
object, kept as its compact text), and for ``bytes`` fields either a base64
string (JSON: standard alphabet, padded, canonical) or ``bytes`` (msgpack
``bin``), as ``bytes_as_base64`` says. Decoding checks types only (the range
rules live in ``bargein.protocol._rules``) and raises :class:`ProtocolError`:
``invalid_message`` for a missing or mistyped field (bad base64 included),
``invalid_parameter`` for a value outside an enumerated set or a non-finite
number. Fields the schema does not know are ignored, so older code reads
newer frames.

Field metadata: ``"wire"`` is the key on the wire (``None``: not a wire
field); ``"null"`` is the value an explicit wire ``null`` decodes to, instead
of "not given", and a field holding that value is written as ``null``.
"""

from __future__ import annotations

import binascii
import dataclasses
import enum
import functools
import json
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from bargein.protocol.errors import ProtocolError
from bargein.protocol.events import ErrorCode, JsonText

T = TypeVar("T")
_NO_NULL: Any = object()  # a field whose wire null means "not given"
_MAX_FLOAT = sys.float_info.max


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Field:
    name: str  # attribute name
    wire: str  # key on the wire
    tp: Any  # resolved type hint
    required: bool  # no default: the key must be present (its value may be null if tp allows)
    null: Any  # what an explicit null decodes to; _NO_NULL: not given


def _dataclass_fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _Field(
            name=f.name,
            wire=f.metadata.get("wire", f.name),
            tp=hints[f.name],
            required=f.default is dataclasses.MISSING,
            null=f.metadata.get("null", _NO_NULL),
        )
        for f in dataclasses.fields(cls)
        if f.metadata.get("wire", f.name) is not None
    )


# Computed once per class. Typed as a plain callable: the cache wrapper takes Hashable
# arguments, and mypy does not count ``type[T]`` (nor ``type[Any]``) as Hashable.
_fields: Callable[[type], tuple[_Field, ...]] = functools.cache(_dataclass_fields)


def to_wire(obj: Any, *, bytes_as_base64: bool) -> dict[str, Any]:
    """The wire map of an event or nested value; ``type`` first when it has one.

    ``None`` optional fields are left out; a required field that is ``None``
    (a nullable one, as ``session.resumed.active``) is written as null, and so
    is a field holding its ``"null"`` value (``TURN_DETECTION_OFF``).

    Args:
        obj: the event or nested dataclass.
        bytes_as_base64: write ``bytes`` as base64 strings (JSON), else as is
            (msgpack ``bin``).
    """
    out: dict[str, Any] = {}
    if isinstance(getattr(type(obj), "type", None), str):
        out["type"] = type(obj).type
    for f in _fields(type(obj)):
        value = getattr(obj, f.name)
        if f.null is not _NO_NULL and value == f.null:
            out[f.wire] = None
        elif value is not None or f.required:
            out[f.wire] = _value_to_wire(value, bytes_as_base64)
    return out


def _value_to_wire(value: Any, bytes_as_base64: bool) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_wire(value, bytes_as_base64=bytes_as_base64)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, JsonText):
        return json.loads(value)
    if isinstance(value, (tuple, list)):
        return [_value_to_wire(v, bytes_as_base64) for v in value]
    if isinstance(value, bytes) and bytes_as_base64:
        return binascii.b2a_base64(value, newline=False).decode("ascii")
    return value


def from_wire(cls: type[T], obj: Any, path: str = "", *, bytes_as_base64: bool) -> T:
    """Build ``cls`` from a wire map, checking every known field's type.

    Args:
        cls: the event or nested dataclass.
        obj: the decoded map.
        path: where ``obj`` sits in the frame, for error messages ("" = top).
        bytes_as_base64: ``bytes`` fields hold base64 strings (JSON), else
            ``bytes`` (msgpack ``bin``).

    Raises:
        ProtocolError: see the module docstring.
    """
    if not isinstance(obj, Mapping):
        raise _invalid(f"{path!r} must be a map" if path else "the frame must be a map")
    kwargs: dict[str, Any] = {}
    for f in _fields(cls):
        where = f"{path}.{f.wire}" if path else f.wire
        value = obj.get(f.wire)
        if value is None:
            if f.null is not _NO_NULL and f.wire in obj:
                kwargs[f.name] = f.null  # an explicit null with a meaning (turn_detection: null)
                continue
            if not f.required:
                continue  # an optional field sent as null counts as absent
            if f.wire not in obj or not _is_optional(f.tp):
                raise _invalid(f"missing field {where!r}")
            kwargs[f.name] = None  # a nullable field (session.resumed.active)
            continue
        kwargs[f.name] = convert(f.tp, value, where, bytes_as_base64=bytes_as_base64)
    return cls(**kwargs)


def convert(tp: Any, value: Any, where: str, *, bytes_as_base64: bool) -> Any:
    """Check (and normalise) one non-null wire value against type hint ``tp``."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) > 1:  # a name or an object (tool_choice): the wire value's shape picks
            objects = [a for a in inner if isinstance(a, type) and dataclasses.is_dataclass(a)]
            others = [a for a in inner if a not in objects]
            assert len(objects) == 1 and len(others) == 1, f"unsupported union {tp!r}"
            inner = objects if isinstance(value, Mapping) else others
        return convert(inner[0], value, where, bytes_as_base64=bytes_as_base64)
    if origin is Literal:
        # Exact type too: True is not 1, and 16000.0 is not the sample rate 16000.
        if not any(type(value) is type(a) and value == a for a in get_args(tp)):
            raise _bad_value(f"{where!r} must be one of {', '.join(map(str, get_args(tp)))}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise _invalid(f"{where!r} must be a list")
        item_tp = get_args(tp)[0]
        return tuple(
            convert(item_tp, v, f"{where}[{i}]", bytes_as_base64=bytes_as_base64) for i, v in enumerate(value)
        )
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if not isinstance(value, str) or value not in {m.value for m in tp}:
            raise _bad_value(f"{where!r} is not a known value")
        return tp(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a class, never an instance, here
        return from_wire(tp, value, where, bytes_as_base64=bytes_as_base64)
    if tp is bytes:
        return _convert_bytes(value, where, bytes_as_base64)
    if tp is JsonText:
        if not isinstance(value, Mapping):
            raise _invalid(f"{where!r} must be an object")
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except ValueError:
            raise _bad_value(f"{where!r} must hold finite numbers only") from None
        _check_encodable(text, where)
        return JsonText(text)
    return _convert_scalar(tp, value, where)


def _convert_bytes(value: Any, where: str, bytes_as_base64: bool) -> bytes:
    if not bytes_as_base64:
        if type(value) is not bytes:
            raise _invalid(f"{where!r} must be binary (msgpack bin)")
        return value
    if type(value) is not str:
        raise _invalid(f"{where!r} must be a base64 string")
    try:
        raw = binascii.a2b_base64(value, strict_mode=True)
    except ValueError:  # binascii.Error, or a character outside ASCII
        raw = None
    # strict_mode still accepts non-zero bits after the last digit ("QR=="): one
    # string per byte string, so re-encode and compare.
    if raw is None or binascii.b2a_base64(raw, newline=False) != value.encode("ascii"):
        raise _invalid(f"{where!r} is not valid base64 (standard alphabet, padded)")
    return raw


def _convert_scalar(tp: type, value: Any, where: str) -> Any:
    if tp is bool:
        if type(value) is not bool:
            raise _invalid(f"{where!r} must be a boolean")
    elif tp is int:
        # bool is an int subclass, and 1.0 is not an int on this wire.
        if type(value) is not int:
            raise _invalid(f"{where!r} must be an integer")
        if not -(2**63) <= value < 2**63:  # what msgpack, Redis and torch carry
            raise _bad_value(f"{where!r} must fit in a signed 64-bit integer")
    elif tp is float:
        if type(value) not in (int, float):
            raise _invalid(f"{where!r} must be a number")
        # an integer past a float's range (JSON and msgpack allow 400 digits) is not finite either
        if type(value) is int and abs(value) > _MAX_FLOAT or not math.isfinite(value):
            raise _bad_value(f"{where!r} must be a finite number")
        return float(value)
    elif tp is str:
        if type(value) is not str:
            raise _invalid(f"{where!r} must be a string")
        _check_encodable(value, where)
    else:  # pragma: no cover - a schema type this module does not handle
        raise AssertionError(f"unsupported schema type {tp!r}")
    return value


def _check_encodable(value: str, where: str) -> None:
    # JSON escapes can smuggle lone surrogates ("\ud800") into a str; they
    # cannot be written back as UTF-8 by the tokenizer, the log or msgpack.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(f"{where!r} is not valid Unicode (lone surrogate)") from None


def _is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def _invalid(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_MESSAGE, message)


def _bad_value(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_PARAMETER, message)
