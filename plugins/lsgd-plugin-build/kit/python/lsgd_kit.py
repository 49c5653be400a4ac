"""Helpers for lsgd:policy plugins in Python (componentize-py), for every plugin kind.

describe() helpers build the `plugin-info` record; `resolve` applies the declared defaults and
checks names and types the way the Rust reference plugins do, and the range checks raise
`Err(message)` with their words, so `configure` fails identically in every language. `Schedule`
is the base of a schedule's exported class (its `momentum`, contract 0.4, defaults to None), and
`check_snapshot` reads a stateful plugin's snapshot.
"""

import gc
import math
from typing import Callable, Dict, List, Optional

from componentize_py_types import Err
from wit_world.imports import types as t


def plugin(spec: t.PluginInfo, config: Callable[[Dict[str, object]], object]):
    """The exported `Plugin` class for `spec`, and a function returning the current configuration.

    `config(values)` builds a plugin's configuration from the resolved parameter values, raising
    `Err(message)` when they are out of range. A fresh instance (the host makes one after any
    fault) starts from the defaults.
    """
    from wit_world import exports

    # A policy call allocates only acyclic objects (the train-state record), which reference
    # counting frees; CPython's cycle collector would now and then walk the whole interpreter
    # heap, millions of instructions that can exhaust a call's fuel budget (10^7 units by
    # default, --plugin-fuel).
    gc.collect()
    gc.disable()
    current = [config(resolve(spec, []))]

    class Plugin(exports.Plugin):
        def describe(self):
            return spec

        def configure(self, params):
            current[0] = config(resolve(spec, params))

    return Plugin, lambda: current[0]


class Schedule:
    """Base of a schedule's exported class: `class Schedule(kit.Schedule)` defining
    `learning_rate(self, s) -> float`, for any contract version.

    From contract 0.4 the host asks `momentum(self, s)` right after `learning_rate`, with the
    same state: a float in [0, 1) sets SGD's momentum (AdamW's beta1) for the step, None keeps
    the configured one. Defining it is optional: this default answers None at every step. Older
    contracts never call it.
    """

    def momentum(self, s) -> Optional[float]:
        return None


def check_snapshot(snapshot: bytes, size: int) -> bytes:
    """`snapshot` if it holds `size` bytes, else `Err` naming both sizes (the Rust plugins' words):
    the check a stateful plugin's `restore` starts with."""
    if len(snapshot) != size:
        raise Err(f"a snapshot of {len(snapshot)} bytes, expected {size}")
    return bytes(snapshot)


def info(name: str, version: str, summary: str, params: List[t.ParamSpec]) -> t.PluginInfo:
    return t.PluginInfo(name=name, version=version, summary=summary, params=params)


def float_(name: str, default: float, doc: str) -> t.ParamSpec:
    return t.ParamSpec(name, t.ParamType_Float(), t.ParamValue_Float(default), doc)


def integer(name: str, default: int, doc: str) -> t.ParamSpec:
    return t.ParamSpec(name, t.ParamType_Integer(), t.ParamValue_Integer(default), doc)


def float_list(name: str, default: List[float], doc: str) -> t.ParamSpec:
    return t.ParamSpec(name, t.ParamType_FloatList(), t.ParamValue_FloatList(default), doc)


def choice(name: str, words: List[str], doc: str) -> t.ParamSpec:
    """A choice whose default is its first word."""
    return t.ParamSpec(name, t.ParamType_Choice(words), t.ParamValue_Text(words[0]), doc)


_KINDS = {
    t.ParamValue_Boolean: "a boolean",
    t.ParamValue_Integer: "an integer",
    t.ParamValue_Float: "a float",
    t.ParamValue_Text: "text",
    t.ParamValue_FloatList: "a list of floats",
}
_EXPECTED = {
    t.ParamType_Boolean: t.ParamValue_Boolean,
    t.ParamType_Integer: t.ParamValue_Integer,
    t.ParamType_Float: t.ParamValue_Float,
    t.ParamType_Text: t.ParamValue_Text,
    t.ParamType_FloatList: t.ParamValue_FloatList,
    t.ParamType_Choice: t.ParamValue_Text,
}


def resolve(spec: t.PluginInfo, given: List[t.Param]) -> Dict[str, object]:
    """The plain values of every declared parameter, `given` overlaid on the defaults."""
    specs = {s.name: s for s in spec.params}
    values: Dict[str, Optional[t.ParamValue]] = {s.name: s.default for s in spec.params}
    for p in given:
        s = specs.get(p.name)
        if s is None:
            known = ", ".join(specs) or "none"
            raise Err(f"unknown parameter '{p.name}' (accepted: {known})")
        want = _EXPECTED[type(s.type)]
        if type(p.value) is not want:
            raise Err(f"parameter '{p.name}' must be {_KINDS[want]}, got {_KINDS[type(p.value)]}")
        if isinstance(s.type, t.ParamType_Choice) and p.value.value not in s.type.value:
            words = ", ".join(s.type.value)
            raise Err(f"parameter '{p.name}' must be one of {words}, got '{p.value.value}'")
        values[p.name] = p.value
    for name, v in values.items():
        if v is None:
            raise Err(f"missing required parameter '{name}'")
    return {name: v.value for name, v in values.items()}


def fmt(v: float) -> str:
    """`v` as Rust's `{}` prints an f64: shortest round-trip digits, never an exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    mantissa, _, exp = repr(v).partition("e")
    sign = "-" if mantissa.startswith("-") else ""
    whole, _, frac = mantissa.lstrip("-").partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + int(exp or 0) - (len(whole + frac) - len(digits))
    digits = digits.rstrip("0")
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def float_at_least(p: Dict[str, object], name: str, lo: float) -> float:
    v = p[name]
    if not (math.isfinite(v) and v >= lo):
        raise Err(f"{name} must be >= {fmt(lo)}, got {fmt(v)}")
    return v


def u32_at_least(p: Dict[str, object], name: str, lo: int) -> int:
    v = p[name]
    if not lo <= v <= 0xFFFFFFFF:
        raise Err(f"{name} must be in [{lo}, {0xFFFFFFFF}], got {v}")
    return v


def milestones(p: Dict[str, object], name: str) -> List[float]:
    prev = 0.0
    for m in p[name]:
        if not (math.isfinite(m) and m >= 0.0):
            raise Err(f"{name} must all be >= 0, got {fmt(m)}")
        if m < prev:
            raise Err(f"{name} must be ascending, got {fmt(m)} after {fmt(prev)}")
        prev = m
    return list(p[name])


def passed(ms: List[float], e: float) -> int:
    """How many milestones the fractional epoch `e` has reached (e >= m)."""
    n = 0
    for m in ms:
        if e < m:
            break
        n += 1
    return n
