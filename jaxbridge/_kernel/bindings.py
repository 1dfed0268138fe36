"""The attributes a C++ handler binds, read from its source, so that a kernel's
attribute types are declared once, in C++ (`jaxbridge.cpp.load` reads them; its
`Library.kernel` types the keyword arguments with them).

A handler defined as ``XLA_FFI_DEFINE_HANDLER_SYMBOL(Name, Impl, ffi::Ffi::Bind()
... .Attr<float>("eps") ...)`` binds the attribute ``eps`` as a C++ ``float``. Only a
binding written inside the macro as one chain of calls is read; one built elsewhere (a
variable, a helper function, a macro inside the chain), a macro that defines handlers
for several names, or a binding that decodes every attribute at once (``.Attrs<T>()``)
leaves the handler's attributes unknown, and the kernel then takes the types declared
in Python (``attrs=``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import KernelError
from .attributes import ATTR_TYPES, attr_type, convert_attr

__all__ = ["CPP_ATTR_TYPES", "bound_attributes", "cpp_name", "typed_attrs"]

#: C++ attribute type (as written, spaces normalized, without ``std::`` on integers) ->
#: the attribute type jaxbridge converts keyword arguments to (attributes.ATTR_TYPES).
CPP_ATTR_TYPES: dict[str, Any] = {
    "bool": bool, "int64_t": int, "double": float, "std::string_view": str,
    "string_view": str, "float": np.float32, "int32_t": np.int32, "int16_t": np.int16,
    "int8_t": np.int8, "uint8_t": np.uint8, "uint16_t": np.uint16, "uint32_t": np.uint32,
    "uint64_t": np.uint64,
}

_DEFINE = re.compile(r"\bXLA_FFI_DEFINE_HANDLER_SYMBOL\s*\(")
_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"', re.DOTALL)


def cpp_name(cpp: str) -> str:
    """A C++ type as the table above spells it (``std::int64_t`` -> ``int64_t``)."""
    cpp = re.sub(r"\s*([<>:,*&])\s*", r"\1", " ".join(cpp.split()))
    return re.sub(r"^std::(u?int\d+_t)$", r"\1", cpp)


def _strip_comments(source: str) -> str:
    """`source` without comments (string literals kept: attribute names are ones)."""
    return _COMMENT.sub(lambda m: m.group(0) if m.group(0).startswith('"') else " ", source)


def _macro_arguments(text: str, start: int) -> list[str] | None:
    """The top-level, comma-separated arguments of the call whose "(" is at `start`."""
    depth, args, begin = 0, [], start + 1
    for i in range(start, len(text)):
        c = text[i]
        if c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth -= 1
            if depth == 0:
                args.append(text[begin:i])
                return [a.strip() for a in args]
        elif c == "," and depth == 1:
            args.append(text[begin:i])
            begin = i + 1
    return None


_BIND = re.compile(r"^(?:[A-Za-z_]\w*\s*::\s*)*Bind\s*(?:<[^<>]*>)?\s*\(\s*\)")
_STEP = re.compile(r"\.\s*([A-Za-z_]\w*)\s*")


def _balanced(text: str, at: int, opening: str, closing: str) -> int:
    """The index after the bracket that closes the one at `at` (-1 if none)."""
    depth = 0
    for i in range(at, len(text)):
        depth += (text[i] == opening) - (text[i] == closing)
        if depth == 0:
            return i + 1
    return -1


def _chain(binding: str) -> list[tuple[str, str, str]] | None:
    """``ffi::Ffi::Bind().A<T>(args).B()...`` as [(method, template, args)], or None for
    anything else (a variable, a macro, a helper's result)."""
    head = _BIND.match(binding)
    if head is None:
        return None
    steps, at = [], head.end()
    while at < len(binding):
        at += len(binding[at:]) - len(binding[at:].lstrip())
        step = _STEP.match(binding, at)
        if step is None:
            return None
        at, template = step.end(), ""
        if binding.startswith("<", at):
            end = _balanced(binding, at, "<", ">")
            if end < 0:
                return None
            template, at = binding[at + 1:end - 1], end
            at += len(binding[at:]) - len(binding[at:].lstrip())
        end = _balanced(binding, at, "(", ")") if binding.startswith("(", at) else -1
        if end < 0:
            return None
        steps.append((step.group(1), template, binding[at + 1:end - 1]))
        at = end
    return steps


def bound_attributes(source: str) -> dict[str, dict[str, Any] | None]:
    """Per handler symbol defined in `source`: ``{attribute: its type}``, where the type
    is a `CPP_ATTR_TYPES` value, or the C++ spelling (a str) of a type jaxbridge does not
    convert (``ffi::Span<const int64_t>``); None where the binding cannot be read.

    Example:
        >>> bound_attributes('XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNorm, Impl, '
        ...                  'ffi::Ffi::Bind().Attr<float>("eps").Arg<ffi::AnyBuffer>());')
        {'RmsNorm': {'eps': <class 'numpy.float32'>}}
    """
    text = _strip_comments(source).replace("->", "  ")  # not a closing ">"
    found: dict[str, dict[str, Any] | None] = {}
    for match in _DEFINE.finditer(text):
        args = _macro_arguments(text, match.end() - 1)
        if not args or len(args) < 3 or not re.fullmatch(r"[A-Za-z_]\w*", args[0]):
            continue
        steps = _chain(args[2])
        if steps is None or any(method == "Attrs" for method, _, _ in steps):
            found[args[0]] = None  # not readable, or every attribute decoded at once
            continue
        attrs: dict[str, Any] = {}
        for method, template, call in steps:
            name = re.fullmatch(r'\s*"([^"]*)"\s*', call)
            if method == "Attr" and name:
                attrs[name.group(1)] = CPP_ATTR_TYPES.get(cpp_name(template),
                                                          cpp_name(template))
        found[args[0]] = attrs
    return found


def _cpp_spelling(kind: Any) -> str:
    return ATTR_TYPES[kind] if kind in ATTR_TYPES else str(kind)


def _bound_by_every_role(name: str, handlers: dict[str, str],
                         bindings: dict[str, dict[str, Any] | None]
                         ) -> dict[str, Any] | None:
    """The attributes every handler of kernel `name` binds ({role: symbol} `handlers`),
    or None where one is unknown; KernelError where two handlers disagree (each is
    passed every attribute)."""
    first: tuple[str, str, dict[str, Any]] | None = None
    for role, symbol in handlers.items():
        bound = bindings.get(symbol)
        if bound is None:
            return None
        if first is None:
            first = (role, symbol, bound)
            continue
        role0, symbol0, bound0 = first
        for key in sorted(set(bound0) | set(bound)):
            a, b = bound0.get(key), bound.get(key)
            if a != b:
                raise KernelError(
                    f"jaxbridge.cpp: kernel {name!r}: handler {symbol0!r} ({role0}) binds "
                    f"{_binding(key, a)} and handler {symbol!r} ({role}) binds "
                    f"{_binding(key, b)}; every handler of a kernel is passed every "
                    f"attribute (the call's keyword arguments): bind the same ones, of "
                    f"the same types, in each")
    return None if first is None else first[2]


def _binding(key: str, kind: Any) -> str:
    return "no attribute " + repr(key) if kind is None else \
        f'.Attr<{_cpp_spelling(kind)}>("{key}")'


def typed_attrs(name: str, handlers: dict[str, str],
                bindings: dict[str, dict[str, Any] | None],
                attrs: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``attrs=`` of kernel `name` whose `handlers` ({role: symbol}) are read in
    `bindings`: the C++ types, with the defaults of `attrs` converted to them; `attrs`
    itself where a handler's binding is unknown or binds a type jaxbridge does not
    convert. KernelError where `attrs` names other attributes or other types than the
    C++ binds, or a default that the C++ type cannot hold.

    Example:
        >>> typed_attrs("rms_norm", {"forward": "RmsNorm"},
        ...             {"RmsNorm": {"eps": np.float32}}, {"eps": 1e-5})
        {'eps': np.float32(1e-05)}
    """
    bound = _bound_by_every_role(name, handlers, bindings)
    if bound is None or any(k not in ATTR_TYPES for k in bound.values()):
        return attrs
    where = f"jaxbridge.cpp: kernel {name!r}"
    symbol = next(iter(handlers.values()))
    if attrs is None:
        return dict(bound)  # every one required (no default)
    if set(attrs) != set(bound):
        raise KernelError(
            f"{where}: attrs= declares {sorted(attrs)}, but its handlers bind "
            f"{sorted(bound)} (handler {symbol!r}); declare the attributes the C++ binds")
    typed: dict[str, Any] = {}
    for key, value in attrs.items():
        kind, declared = bound[key], attr_type(value)
        if declared is None:  # not an attribute type: jaxbridge.kernel says so
            typed[key] = value
        elif isinstance(value, type):
            if ATTR_TYPES[declared] != ATTR_TYPES[kind]:
                raise KernelError(
                    f"{where}: attrs[{key!r}] is declared {ATTR_TYPES[declared]}, "
                    f"but handler {symbol!r} binds {_binding(key, kind)}; declare "
                    f"{kind.__name__} (or drop attrs=: the C++ types are read from the "
                    f"source)")
            typed[key] = kind
        else:
            typed[key] = convert_attr(f"{where} (a default in attrs=)", key, value, kind)
    return typed
