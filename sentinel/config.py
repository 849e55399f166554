"""Build frozen dataclasses from plain mappings (parsed YAML) with located, helpful errors.

One generic validator serves the scenario schema and every plugin's `Config`:

- unknown keys -> `path: unknown key 'scael' (did you mean 'scale'?)`
- wrong types -> `path: expected int, got 'abc' (str)`
- ranges from field metadata (`ge`, `gt`, `le`, `lt`) -> `path: must be >= 1, got -2`
- `Literal[...]` choices -> `path: 'foo' is not one of 'a', 'b' (did you mean ...)`
- plugin sections (`PluginSpec` subclasses): `name` picks a plugin from a registry and the remaining
  keys are validated against that plugin's own `Config`.

All problems are collected and raised together as one `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from sentinel.errors import ConfigError, UnknownPluginError
from sentinel.registry import REGISTRIES, did_you_mean

# Integers without a stated range (plug-in parameters mostly: windows, memories, step counts) accept
# |x| <= 10^7, the step bound: they size buffers and loops, and a 20-digit value must never reach numpy,
# torch or range(). A key that needs more, or less, states its own `ge` / `le`.
INT_BOUNDS = {"ge": -10_000_000, "le": 10_000_000}


def spec(default: Any = dataclasses.MISSING, *, help: str = "", **rules: Any) -> Any:
    """A dataclass field with a help text and range rules (ge, gt, le, lt)."""
    meta = {"help": help, **rules}
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple or default_factory for mutable defaults")
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PluginSpec:
    """A section whose `name` selects a registered plugin; its other keys configure that plugin.

    Subclasses set `PLUGIN_KIND` (a registry kind) and may add their own common fields
    (for example an attack's schedule). `config` holds the plugin's validated `Config` instance.
    """

    PLUGIN_KIND: ClassVar[str] = ""
    name: str
    config: Any = None

    def params(self) -> dict[str, Any]:
        return to_plain(self.config) if self.config is not None else {}


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, msg: str) -> None:
        self.items.append(f"{path or '<root>'}: {msg}")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _check_rules(value: Any, meta: Mapping[str, Any], path: str, problems: _Problems) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    for rule, op, word in (
        ("ge", lambda a, b: a >= b, ">="),
        ("gt", lambda a, b: a > b, ">"),
        ("le", lambda a, b: a <= b, "<="),
        ("lt", lambda a, b: a < b, "<"),
    ):
        if rule in meta and not op(value, meta[rule]):
            problems.add(path, f"must be {word} {meta[rule]}, got {_short(value)}")
            return


def _short(value: Any) -> str:
    """A number as it reads in a message (an integer of hundreds of digits by its length)."""
    if isinstance(value, int) and len(str(abs(value))) > 24:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def range_text(meta: Mapping[str, Any], tp: Any = None) -> str:
    """`1 <= x <= 1024`-style text of a field's range rules (integers get the default INT_BOUNDS)."""
    rules = dict(INT_BOUNDS) if tp is int else {}
    rules = {k: v for k, v in rules.items() if {"ge": "gt", "le": "lt"}[k] not in meta} | dict(meta)
    low = f"{rules['ge']} <= " if "ge" in rules else f"{rules['gt']} < " if "gt" in rules else ""
    high = f" <= {rules['le']}" if "le" in rules else f" < {rules['lt']}" if "lt" in rules else ""
    return f"{low}x{high}" if low or high else ""


def _convert(value: Any, tp: Any, path: str, problems: _Problems, meta: Mapping[str, Any]) -> Any:
    """Convert `value` to type `tp`; on failure record a problem and return None."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _convert(value, non_none[0], path, problems, meta)
        trials = {}
        for a in non_none:  # first type that converts cleanly
            trial = _Problems()
            out = _convert(value, a, path, trial, meta)
            if not trial.items:
                return out
            trials[a] = trial
        shaped = [a for a in non_none if typing.get_origin(a) is tuple] if isinstance(value, (list, tuple)) else []
        if len(shaped) == 1:  # a list for an `int | tuple[int, ...]` field: its items' own located problems
            problems.items.extend(trials[shaped[0]].items)
            return None
        problems.add(path, f"expected one of {', '.join(_type_name(a) for a in non_none)}, got {_describe(value)}")
        return None
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            problems.add(path, f"{value!r} is not one of {choices}{did_you_mean(str(value), [str(a) for a in args])}")
            return None
        return value
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            problems.add(path, f"expected a list, got {_describe(value)}")
            return None
        item_tp = args[0] if args else Any
        return tuple(_convert(v, item_tp, _join(path, i), problems, meta) for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            problems.add(path, f"expected a mapping, got {_describe(value)}")
            return None
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                problems.add(_join(path, str(k)), f"keys are strings, got {_describe(k)}")
                continue
            out[k] = _convert(v, args[1], _join(path, k), problems, meta) if len(args) == 2 else v
        return out
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, path, problems)
    if tp is bool:
        if not isinstance(value, bool):
            problems.add(path, f"expected true or false, got {_describe(value)}")
            return None
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.add(path, f"expected an integer, got {_describe(value)}")
            return None
        _check_rules(value, {**INT_BOUNDS, **meta}, path, problems)
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-3" as a string; accept it as a number
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.add(path, f"expected a number, got {_describe(value)}")
            return None
        try:
            value = float(value)
        except OverflowError:  # an integer with hundreds of digits
            problems.add(path, f"must be a finite number, got an integer of {len(str(abs(value)))} digits")
            return None
        if not math.isfinite(value):
            problems.add(path, f"must be a finite number, got {value!r}")
            return None
        _check_rules(value, meta, path, problems)
        return value
    if tp is str:
        if not isinstance(value, str):
            problems.add(path, f"expected a string, got {_describe(value)}")
            return None
        return value
    raise TypeError(f"config.py cannot convert to {tp!r} (at {path})")  # internal: schema bug


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build(cls: type, data: Any, path: str = "", problems: _Problems | None = None) -> Any:
    """Build dataclass `cls` from mapping `data`. Raises ConfigError unless `problems` is given."""
    own = problems is None
    problems = problems if problems is not None else _Problems()
    if data is None:
        data = {}
    if isinstance(cls, type) and issubclass(cls, PluginSpec) and isinstance(data, str):
        data = {"name": data}  # shorthand: `aggregator: median`
    if not isinstance(data, Mapping):
        problems.add(path, f"expected a mapping, got {_describe(data)}")
        if own:
            raise ConfigError(problems.items)
        return None
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    plugin_cls = None
    if issubclass(cls, PluginSpec):
        fields.pop("config", None)
        name = data.get("name")
        if not isinstance(name, str):
            problems.add(_join(path, "name"), f"a {cls.PLUGIN_KIND} name is required, got {_describe(name)}")
        else:
            try:
                plugin_cls = REGISTRIES[cls.PLUGIN_KIND].get(name)
            except UnknownPluginError as exc:
                problems.add(_join(path, "name"), str(exc))
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    aliases = {f.metadata["alias"]: n for n, f in fields.items() if f.metadata.get("alias")}  # YAML key -> field
    for key, value in data.items():
        if aliases.get(key, key) in fields:
            fname = aliases.get(key, key)
            f = fields[fname]
            kwargs[fname] = _convert(value, hints[fname], _join(path, key), problems, f.metadata)
        elif plugin_cls is not None:
            extra[key] = value
        else:
            names = [f.metadata.get("alias") or n for n, f in fields.items()]
            valid = names + (["<plugin parameters>"] if issubclass(cls, PluginSpec) else [])
            problems.add(
                _join(path, str(key)),
                f"unknown key {str(key)!r}{did_you_mean(str(key), names)}; valid keys: {', '.join(valid)}",
            )
    for name, f in fields.items():
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            problems.add(_join(path, name), "required key is missing")
    if plugin_cls is not None:
        pc = plugin_cls.Config
        pfields = {f.name for f in dataclasses.fields(pc)}
        for key in list(extra):
            if key not in pfields:
                problems.add(
                    _join(path, str(key)),
                    f"unknown key {str(key)!r}{did_you_mean(str(key), list(fields) + sorted(pfields))} "
                    f"for {cls.PLUGIN_KIND} {data['name']!r}; valid keys: {', '.join(list(fields) + sorted(pfields))}",
                )
                extra.pop(key)
        kwargs["config"] = build(pc, extra, path, problems)
    obj = None
    if not problems.items or not own:
        try:
            obj = cls(**kwargs)
        except TypeError:
            obj = None  # a missing required field, already reported
    if own and problems.items:
        raise ConfigError(problems.items)
    return obj


def type_text(tp: Any) -> str:
    """A field type as the schema listing shows it: `int`, `float | null`, `gpipe | 1f1b`, `list of str`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_text(a) for a in args)
    if origin is tuple:
        return f"list of {type_text(args[0]) if args else 'any'}"
    if origin in (dict, Mapping) or tp is dict:
        return "mapping"
    if isinstance(tp, type) and issubclass(tp, PluginSpec):
        return f"{tp.PLUGIN_KIND[:-1]} (name + its parameters: `sentinel describe NAME`)"
    return getattr(tp, "__name__", str(tp))


def schema_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """(key, type, default, range, help) for every key of a config dataclass, nested sections expanded."""
    rows = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name == "config":
            continue
        key = f"{prefix}{f.metadata.get('alias') or f.name}"
        tp = hints[f.name]
        inner = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple and typing.get_args(tp) else None
        nested = tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None
        if nested is not None:
            if issubclass(nested, PluginSpec):  # name + the spec's own keys; the plug-in's keys: describe NAME
                name = to_plain(f.default_factory()).get("name") if callable(f.default_factory) else None
                rows.append(
                    (
                        f"{key}.name",
                        f"{nested.PLUGIN_KIND[:-1]} name",
                        repr(name),
                        "",
                        f"`sentinel list {nested.PLUGIN_KIND}`; its parameters: `sentinel describe NAME`",
                    )
                )
            rows += [r for r in schema_rows(nested, f"{key}.") if r[0] != f"{key}.name"]
            continue
        if inner is not None and isinstance(inner, type) and dataclasses.is_dataclass(inner):
            rows.append(
                (
                    key,
                    f"list of {inner.PLUGIN_KIND[:-1] if issubclass(inner, PluginSpec) else 'items'}",
                    "[]",
                    "",
                    f.metadata.get("help", ""),
                )
            )
            rows += schema_rows(inner, f"{key}[].")
            continue
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = repr(to_plain(f.default_factory()))  # type: ignore[misc]
        else:
            default = "(required)" if f.default is dataclasses.MISSING else repr(f.default)
        scalar = next((a for a in (tp, *typing.get_args(tp)) if a in (int, float)), None)
        rows.append((key, type_text(tp), default, range_text(f.metadata, scalar), f.metadata.get("help", "")))
    return rows


def to_plain(obj: Any) -> Any:
    """Dataclass -> plain dict/list (plugin configs flattened back beside `name`)."""
    if isinstance(obj, PluginSpec):
        out = {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "config"}
        out.update(to_plain(obj.config) if obj.config is not None else {})
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.metadata.get("alias") or f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b[0].c` (or `a.b.0.c`) in nested dicts/lists, creating dicts as needed."""
    import re

    parts: list[str | int] = []
    for token in dotted.split("."):
        m = re.fullmatch(r"([^\[\]]*)((?:\[\d+\])*)", token)
        if not m or (not m.group(1) and not m.group(2)):
            raise ConfigError(f"--set {dotted}: cannot parse key path (use a.b.c or a.b[0].c)")
        if m.group(1):
            parts.append(int(m.group(1)) if m.group(1).isdigit() else m.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    node: Any = data
    for i, key in enumerate(parts[:-1]):
        where = ".".join(str(p) for p in parts[: i + 1])
        if isinstance(key, int):
            if not isinstance(node, list) or key >= len(node):
                raise ConfigError(f"--set {dotted}: {where} is not a list index that exists")
            node = node[key]
        else:
            if not isinstance(node, dict):
                raise ConfigError(f"--set {dotted}: {where} is not a mapping")
            node = node.setdefault(key, {})
            if node is None:
                raise ConfigError(f"--set {dotted}: {where} is empty")
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigError(f"--set {dotted}: index {last} does not exist")
    elif not isinstance(node, dict):
        where = ".".join(str(p) for p in parts[:-1])
        raise ConfigError(f"--set {dotted}: {where} is {node!r}, not a mapping")
    node[last] = value


def describe_plugin(registry, name: str) -> dict[str, Any]:
    """Parameters (type, default, range, help) and docs of one registered plugin (for `sentinel describe`)."""
    cls = registry.get(name)
    params = []
    for f in dataclasses.fields(cls.Config):
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        is_int = f.type in (int, "int", "int | None")  # plug-in modules use string annotations
        params.append(
            {
                "name": f.name,
                "type": getattr(f.type, "__name__", str(f.type)),
                "default": default,
                "help": f.metadata.get("help", ""),
                "range": range_text(f.metadata, int if is_int else None),
            }
        )
    return {"kind": registry.kind, "name": name, "doc": (cls.__doc__ or "").strip(), "params": params}
