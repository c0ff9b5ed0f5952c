"""Type and range checks of the config dataclasses' fields: the one way every config validates itself.

A config's fields become C++ template arguments (name expressions such as ``conv3d_kernel<..., 16, 64, ...>``),
fixed-width kernel arguments (``int32``, ``unsigned``), CuTe compile-time constants, compile-cache keys and
tuned-table JSON. A value of the wrong type gets through all of them in some form: ``True`` or ``256.0`` pass a
membership test (``True == 1``, ``256.0 == 256``) and reach NVRTC as the identifiers ``True`` or ``256.0``; a
str where a bool belongs is truthy; a float becomes a ctypes TypeError at launch; an int past 2^31 wraps in a
32-bit argument. So each config's ``__post_init__`` calls :func:`check_fields` first, which holds every field to
the type its annotation declares, exactly, and then its own range checks, written with :func:`field_error`,
:func:`check_choice` and :func:`check_range` so every message reads ``Class.field: expected ..., got ...``.

Exactly means: an ``int`` field takes a Python ``int`` and nothing else, not a ``bool`` (an int subclass),
not an integral float (``256.0``), not a numpy integer; a ``bool`` field takes ``True`` or ``False``, not 0/1,
not ``numpy.bool_``, not a string; a ``str`` field a Python ``str``. Numpy scalars are refused rather than
converted because a config is a frozen value: it is written to the tuned tables with ``json.dumps`` (which
refuses numpy scalars), hashed into compile keys and formatted into names, and a converting ``__post_init__``
would make a config differ from the fields it was given. A caller holding numpy values converts them with
``int()`` / ``bool()``; a reader of JSON (``tuned.config_from_fields``) passes the decoded values through as
they are, and this check refuses what JSON got wrong.
"""

from __future__ import annotations

import dataclasses
import math
import typing

__all__ = ["ConfigFieldTypeError", "check_fields", "field_error", "check_choice", "check_range"]


class ConfigFieldTypeError(TypeError, ValueError):
    """A config field of the wrong type. A TypeError, as every wrong type is; also a ValueError, so that code
    treating every invalid config as a ValueError (callers that skip invalid configs, the config tests that
    give a field 32.0 or True) still sees one."""


def _type_name(value) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _exact(kind: type, expected: str):
    def check(value) -> str | None:
        return None if type(value) is kind else expected

    return check


def _check_float(value) -> str | None:
    # An int is a float's value too (PEP 484's numeric tower), but a bool is not a number here.
    if type(value) not in (float, int) or not math.isfinite(value):
        return "a finite float"
    return None


def _tuple_checker(hint):
    args = typing.get_args(hint)
    if not args:
        return _exact(tuple, "a tuple")
    if len(args) == 2 and args[1] is Ellipsis:
        item = _checker(args[0])
        expected = f"a tuple, each item {_expected_of(args[0])}"

        def check_homogeneous(value) -> str | None:
            if type(value) is not tuple or any(item(v) is not None for v in value):
                return expected
            return None

        return check_homogeneous
    items = [_checker(a) for a in args]
    expected = f"a tuple of {len(args)} ({', '.join(_expected_of(a) for a in args)})"

    def check_fixed(value) -> str | None:
        if type(value) is not tuple or len(value) != len(items):
            return expected
        return expected if any(c(v) is not None for c, v in zip(items, value)) else None

    return check_fixed


_EXACT = {int: "an int", bool: "a bool", str: "a str"}


def _expected_of(hint) -> str:
    if hint in _EXACT:
        return _EXACT[hint]
    if hint is float:
        return "a finite float"
    return repr(hint)


def _checker(hint):
    """A function value -> None (right type) or what was expected, for the annotation ``hint``."""
    if hint in _EXACT:
        return _exact(hint, _EXACT[hint])
    if hint is float:
        return _check_float
    if hint is tuple or typing.get_origin(hint) is tuple:
        return _tuple_checker(hint)
    raise TypeError(f"config_fields has no type rule for the annotation {hint!r}: annotate config fields with "
                    "int, bool, str, float or tuple[...]")


_checkers: dict[type, tuple] = {}  # config class -> ((field name, checker), ...), built on its first config


def _checkers_of(cls: type) -> tuple:
    checkers = _checkers.get(cls)
    if checkers is None:
        # get_type_hints resolves the string annotations of ``from __future__ import annotations`` modules.
        hints = typing.get_type_hints(cls)
        try:
            checkers = tuple((f.name, _checker(hints[f.name])) for f in dataclasses.fields(cls))
        except TypeError as e:
            raise TypeError(f"{cls.__name__}: {e}") from None
        _checkers[cls] = checkers
    return checkers


def check_fields(config) -> None:
    """Every dataclass field of ``config`` holds exactly the type its annotation declares, or a
    :class:`ConfigFieldTypeError` (a TypeError) names ``Class.field``, what was expected and what came."""
    for name, check in _checkers_of(type(config)):
        value = getattr(config, name)
        expected = check(value)
        if expected is not None:
            raise ConfigFieldTypeError(f"{type(config).__name__}.{name}: expected {expected}, got {value!r} "
                                       f"({_type_name(value)})")


def field_error(config, name: str, expected: str) -> ValueError:
    """The ValueError for a field of the right type and a wrong value."""
    return ValueError(f"{type(config).__name__}.{name}: expected {expected}, got {getattr(config, name)!r}")


def check_choice(config, name: str, choices: tuple, expected: str | None = None) -> None:
    """The field is one of ``choices`` (compared after check_fields, so ``True`` never stands for 1)."""
    if getattr(config, name) not in choices:
        raise field_error(config, name, expected or "one of " + ", ".join(map(str, choices)))


def check_range(config, name: str, low: int, high: int, expected: str | None = None) -> None:
    """``low <= field <= high``; every integer field that reaches a kernel has both ends."""
    if not low <= getattr(config, name) <= high:
        raise field_error(config, name, expected or f"{low}..{high}")
