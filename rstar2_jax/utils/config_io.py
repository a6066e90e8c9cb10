"""Nested frozen-dataclass configs from JSON: typed, with errors that name the dotted field (no JAX).

A run spec (``run.spec.RunSpec``) holds component configs (``LossConfig``, ``EngineSpec``, ``SandboxLimits``, ...). In a
JSON file each is an object; :func:`build` turns it into the dataclass, checking every key against the
dataclass's fields and every value against the field's annotation before the component's own
``__post_init__`` checks ranges:

    build(LossConfig, {"kind": "gspo", "eps_high": 0.28}, where="RunSpec.rl.loss")

Unknown keys, wrong types and the component's own ``ValueError`` all come back as ``ValueError``
prefixed with the dotted field (``RunSpec.rl.loss.kind: ...``). :func:`to_plain` is the inverse
(enums as their values, tuples as lists), and :func:`set_dotted` applies a command line's
``--set rl.loss.kind=gspo`` to the raw JSON before anything is built.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, Mapping

_NONE = type(None)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    if tp is _NONE:
        return "null"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return f"one of {[m.value for m in tp]}"
    if dataclasses.is_dataclass(tp):
        return f"an object of {tp.__name__} fields"
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return f"one of {list(typing.get_args(tp))}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "a list"
    return {int: "an int", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


class _Mismatch(Exception):
    pass


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """``value`` as annotation ``tp`` requires; raises ``_Mismatch`` (a wrong type) or ``ValueError``
    (from a nested build, already naming its field)."""
    if tp is Any:
        return value
    if tp is _NONE:
        if value is None:
            return None
        raise _Mismatch
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        for arg in sorted(args, key=lambda a: a is str):  # an enum or a literal before a plain str
            try:
                return _coerce(arg, value, where)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise _Mismatch
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, where) for v in value)
        if len(args) != len(value):
            raise _Mismatch
        return tuple(_coerce(a, v, where) for a, v in zip(args, value))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise _Mismatch from None
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return build(tp, value, where=where)
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Mismatch
    return value  # an annotation this module does not interpret (a Protocol, a TypeVar): the class checks it


def build(cls: type, raw: Any, *, where: str) -> Any:
    """``cls(**raw)`` with every key known and every value of its annotated type (nested dataclasses
    from nested objects); errors are ``ValueError`` naming ``where.<field>``."""
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object of {cls.__name__} fields, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field (known: {sorted(fields)})")
    hints = _hints(cls)
    kwargs = {}
    for name, value in raw.items():
        try:
            kwargs[name] = _coerce(hints[name], value, f"{where}.{name}")
        except _Mismatch:
            raise ValueError(f"{where}.{name} must be {_describe(hints[name])}, got {value!r}") from None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        msg = str(e)
        msg = msg.split(": ", 1)[1] if msg.startswith(f"{cls.__name__}") and ": " in msg else msg
        raise ValueError(f"{where}: {msg}") from None


def to_plain(obj: Any) -> Any:
    """A dataclass (or nested containers of them) as plain JSON values: what :func:`build` reads back."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return to_plain(obj.value)
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """``raw["a"]["b"] = value`` for ``key`` "a.b" (intermediate objects made as needed; a dataclass
    value on the way is first turned into its plain dict)."""
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if dataclasses.is_dataclass(child) and not isinstance(child, type):
            child = to_plain(child)
        if child is None:
            child = {}
        if not isinstance(child, dict):
            raise ValueError(f"--set {key}: {'.'.join(parts[:i + 1])} is {child!r}, not an object")
        node[part] = child = dict(child)
        node = child
    node[parts[-1]] = value
