"""Exact state of the run's stateful plug-ins, as plain data a checkpoint can hold (`torch.load(weights_only=True)`).

`capture(objects)` walks the objects' attributes and turns them into nested dicts, lists, tuples, numbers,
strings, bytes and tensors; `restore(objects, tree)` writes that state back into freshly built objects of the
same run (the same scenario builds the same objects), in place where an object already exists, so references
the engine shares with a plug-in stay shared. What it handles: containers (dict with any keys, list, tuple,
deque, set), slices and ranges, numpy arrays and scalars, numpy and torch random generators, tensors, enums, objects with
`state_dict`/`load_state_dict`, and instances (dataclasses included) of classes defined in `sentinel`,
`attacks`, a registered plug-in's module, or networkx (the simulated network's graph). What it leaves alone,
because the run rebuilds it or saves it elsewhere: functions and bound methods, modules, classes, the
EventLog, model replicas, torch modules and optimizers (saved with the replicas), threads, locks and queues.

Anything else (an open file, a C extension object) raises `StateError` naming the plug-in and the attribute
path: a run whose plug-ins cannot be checkpointed refuses `--checkpoint-every` at its start instead of
resuming wrong.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import importlib
import queue
import threading
import types
from typing import Any

import numpy as np
import torch

from sentinel.errors import SentinelError
from sentinel.eventlog import EventLog
from sentinel.registry import REGISTRIES

KIND = "__kind__"
KEEP = {KIND: "keep"}
_ALLOWED_PREFIXES = ("sentinel.", "attacks.", "networkx.", "tests.")


class StateError(SentinelError):
    """A plug-in whose state this module cannot capture (names it and the attribute)."""


# Left alone (kept as the rebuilt run has them): saved elsewhere, rebuilt by the run, or not state at all
EXCLUDED: tuple[type, ...] = (
    EventLog,
    torch.nn.Module,
    torch.optim.Optimizer,
    types.ModuleType,
    type,
    threading.Thread,
    type(threading.Lock()),
    queue.Queue,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    functools.partial,
)


def allowed_class(qualified: str) -> bool:
    module = qualified.split(":", 1)[0]
    if module.startswith(_ALLOWED_PREFIXES) or module in ("sentinel", "attacks"):
        return True
    return any(
        module == getattr(REGISTRIES[k].get(n), "__module__", None) for k in REGISTRIES for n in REGISTRIES[k].names()
    )


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve(qualified: str) -> type:
    if not allowed_class(qualified):
        raise StateError(f"checkpoint names class {qualified}, which is not a sentinel, attack or plug-in class")
    module, qual = qualified.split(":", 1)
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


class _Capture:
    def __init__(self, exclude: tuple[type, ...] = ()) -> None:
        self.memo: dict[int, int] = {}
        self.excluded = EXCLUDED + tuple(exclude)

    def __call__(self, obj: Any, path: str) -> Any:
        if isinstance(obj, enum.Enum):  # before int: an IntEnum is an int
            return {KIND: "enum", "cls": _name(type(obj)), "value": obj.value}
        if obj is None or type(obj) in (bool, int, float, str, bytes):
            return obj
        if isinstance(obj, np.generic):
            return {KIND: "npscalar", "dtype": str(obj.dtype), "value": obj.item()}
        if isinstance(obj, (bool, int, float, str, bytes)):  # a subclass (e.g. numpy's float64): as the base type
            return type(obj).__mro__[[c in (bool, int, float, str, bytes) for c in type(obj).__mro__].index(True)](obj)
        if isinstance(obj, (slice, range)):
            return {KIND: type(obj).__name__, "args": (obj.start, obj.stop, obj.step)}
        if isinstance(obj, torch.Tensor):
            return obj.detach().clone()
        if isinstance(obj, np.ndarray):
            if obj.dtype == object or obj.dtype.kind in "USV":
                return {KIND: "nplist", "dtype": str(obj.dtype), "items": obj.tolist()}
            raw = np.ascontiguousarray(obj).reshape(-1).view(np.uint8).copy()
            return {KIND: "np", "dtype": str(obj.dtype), "data": torch.from_numpy(raw), "shape": tuple(obj.shape)}
        if isinstance(obj, np.generic):
            return {KIND: "npscalar", "dtype": str(obj.dtype), "value": obj.item()}
        if isinstance(obj, np.random.Generator):
            return {KIND: "nprng", "bitgen": type(obj.bit_generator).__name__, "state": obj.bit_generator.state}
        if isinstance(obj, torch.Generator):
            return {KIND: "trng", "state": obj.get_state()}
        if isinstance(obj, self.excluded):
            return KEEP
        if isinstance(obj, collections.deque):
            return {KIND: "deque", "maxlen": obj.maxlen, "items": [self(x, f"{path}[{i}]") for i, x in enumerate(obj)]}
        if isinstance(obj, (set, frozenset)):
            return {KIND: "set", "frozen": isinstance(obj, frozenset), "items": [self(x, path) for x in obj]}
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple
            return {KIND: "ntuple", "cls": _name(type(obj)), "items": [self(x, path) for x in obj]}
        if isinstance(obj, tuple):
            return tuple(self(x, f"{path}[{i}]") for i, x in enumerate(obj))
        if isinstance(obj, list):
            return [self(x, f"{path}[{i}]") for i, x in enumerate(obj)]
        if isinstance(obj, (dict, types.MappingProxyType)):
            if all(isinstance(k, str) for k in obj) and KIND not in obj and type(obj) in (dict,):
                return {k: self(v, f"{path}.{k}") for k, v in obj.items()}
            return {
                KIND: "dict",
                "proxy": isinstance(obj, types.MappingProxyType),
                "items": [(self(k, path), self(v, f"{path}[{k!r}]")) for k, v in obj.items()],
            }
        return self._object(obj, path)

    def _object(self, obj: Any, path: str) -> dict:
        cls = type(obj)
        if getattr(cls, "registry_name", ""):  # a plug-in: name it in any error below
            path = f"{path} (plug-in {cls.registry_name!r})"
        if id(obj) in self.memo:
            return {KIND: "ref", "id": self.memo[id(obj)]}
        if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
            self.memo[id(obj)] = len(self.memo)
            return {KIND: "sd", "id": self.memo[id(obj)], "state": self(obj.state_dict(), f"{path}.state_dict()")}
        names = list(getattr(obj, "__dict__", {}))
        for klass in cls.__mro__:
            names += [s for s in getattr(klass, "__slots__", ()) if s not in ("__dict__", "__weakref__")]
        if not names and not dataclasses.is_dataclass(obj):
            raise StateError(f"{path}: a {cls.__module__}.{cls.__qualname__} cannot be checkpointed")
        if not allowed_class(_name(cls)):
            raise StateError(
                f"{path}: {cls.__module__}.{cls.__qualname__} is not a sentinel, attack or plug-in "
                "class; give it state_dict() / load_state_dict()"
            )
        self.memo[id(obj)] = len(self.memo)
        attrs = {n: self(getattr(obj, n), f"{path}.{n}") for n in dict.fromkeys(names) if hasattr(obj, n)}
        return {KIND: "obj", "cls": _name(cls), "id": self.memo[id(obj)], "attrs": attrs}


class _Restore:
    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}

    def __call__(self, existing: Any, tree: Any) -> Any:
        if isinstance(tree, tuple):
            olds = existing if isinstance(existing, tuple) and len(existing) == len(tree) else (None,) * len(tree)
            return tuple(self(o, t) for o, t in zip(olds, tree))
        if isinstance(tree, list):
            olds = existing if isinstance(existing, list) and len(existing) == len(tree) else [None] * len(tree)
            out = [self(o, t) for o, t in zip(olds, tree)]
            if isinstance(existing, list):
                existing[:] = out  # keep the list object: others may hold it
                return existing
            return out
        if not isinstance(tree, dict):
            return tree
        kind = tree.get(KIND)
        if kind is None:
            out = {k: self(existing.get(k) if isinstance(existing, dict) else None, v) for k, v in tree.items()}
            return _refill(existing, out)
        return getattr(self, f"_{kind}")(existing, tree)

    def _keep(self, existing, tree):
        return existing

    def _enum(self, existing, tree):
        return _resolve(tree["cls"])(tree["value"])

    def _slice(self, existing, tree):
        return slice(*tree["args"])

    def _range(self, existing, tree):
        return range(*tree["args"])

    def _np(self, existing, tree):
        return tree["data"].numpy().view(np.dtype(tree["dtype"])).reshape(tree["shape"]).copy()

    def _nplist(self, existing, tree):
        return np.array(tree["items"], dtype=np.dtype(tree["dtype"]))

    def _npscalar(self, existing, tree):
        return np.dtype(tree["dtype"]).type(tree["value"])

    def _nprng(self, existing, tree):
        rng = (
            existing
            if isinstance(existing, np.random.Generator)
            else np.random.Generator(getattr(np.random, tree["bitgen"])())
        )
        rng.bit_generator.state = tree["state"]
        return rng

    def _trng(self, existing, tree):
        gen = existing if isinstance(existing, torch.Generator) else torch.Generator()
        gen.set_state(tree["state"])
        return gen

    def _deque(self, existing, tree):
        return collections.deque((self(None, t) for t in tree["items"]), maxlen=tree["maxlen"])

    def _set(self, existing, tree):
        items = [self(None, t) for t in tree["items"]]
        return frozenset(items) if tree["frozen"] else set(items)

    def _ntuple(self, existing, tree):
        return _resolve(tree["cls"])(*(self(None, t) for t in tree["items"]))

    def _dict(self, existing, tree):
        out = {}
        for k, v in tree["items"]:
            key = self(None, k)
            out[key] = self(existing.get(key) if isinstance(existing, dict) else None, v)
        return types.MappingProxyType(out) if tree["proxy"] else _refill(existing, out)

    def _ref(self, existing, tree):
        return self.memo[tree["id"]]

    def _sd(self, existing, tree):
        if existing is None or not callable(getattr(existing, "load_state_dict", None)):
            raise StateError("a checkpointed state_dict() has no object to load into in this run")
        self.memo[tree["id"]] = existing
        existing.load_state_dict(self(None, tree["state"]))
        return existing

    def _obj(self, existing, tree):
        cls = _resolve(tree["cls"])
        target = existing if type(existing) is cls else cls.__new__(cls)
        self.memo[tree["id"]] = target
        for name, sub in tree["attrs"].items():
            object.__setattr__(target, name, self(getattr(target, name, None), sub))
        return target


def _refill(existing: Any, new: dict) -> dict:
    """`new`'s items in the existing dict object when there is one (others may hold it), else `new`."""
    if type(existing) is dict:
        existing.clear()
        existing.update(new)
        return existing
    return new


def capture(objects: dict[str, Any], exclude: tuple[type, ...] = ()) -> dict[str, Any]:
    """Plain-data state of named objects (one walk: objects shared between them are captured once); instances of
    `exclude` (e.g. the engine's replicas, saved on their own) are left alone like the EXCLUDED types."""
    walk = _Capture(exclude)
    return {name: walk(obj, name) for name, obj in objects.items()}


def restore(objects: dict[str, Any], tree: dict[str, Any]) -> dict[str, Any]:
    """Write `tree` (from `capture`) back into `objects` (same names); returns the restored objects, which are the
    given ones wherever they could be restored in place."""
    walk = _Restore()
    missing = sorted(set(tree) - set(objects))
    if missing:
        raise StateError(f"the checkpoint holds state for {', '.join(missing)}, which this run does not have")
    return {name: walk(objects[name], sub) for name, sub in tree.items()}
