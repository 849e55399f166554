"""Plugin registries: one per kind, decorator registration, "did you mean" on unknown names.

Every pluggable part (attacks, detectors, aggregators, codecs)
lives in a `Registry`. A plugin is a class with a nested frozen `Config` dataclass (its
hyper-parameters, validated from the scenario file) and a docstring whose first line is its
one-line description::

    @AGGREGATORS.register("mean")
    class Mean:
        '''Weighted mean of replica gradients (exact all-reduce).'''

        @dataclass(frozen=True, kw_only=True)
        class Config:
            pass

        def __init__(self, config: Config): ...

Third-party packages register through the entry-point group `sentinel.<kind>` (for example
`sentinel.attacks`); the entry point's object is imported, which runs its decorators. Nothing is
ever imported from a dotted path written in a scenario file.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sentinel.errors import SentinelError, UnknownPluginError

T = TypeVar("T")


def did_you_mean(name: str, choices: list[str]) -> str:
    """Return `" (did you mean 'x'?)"` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmptyConfig:
    """Config for a plugin without hyper-parameters."""


class Registry:
    """A name -> plugin class table for one kind of plugin."""

    def __init__(self, kind: str, builtin_modules: tuple[str, ...] = ()):
        self.kind = kind
        self._entries: dict[str, type] = {}
        self._builtin_modules = builtin_modules
        self._loaded = False

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: register `cls` under `name` (lower_snake; duplicates raise)."""
        if not name or name != name.lower() or " " in name:
            raise SentinelError(f"{self.kind} plugin name {name!r} must be lower_snake_case")

        def deco(cls: type[T]) -> type[T]:
            if name in self._entries and self._entries[name] is not cls:
                raise SentinelError(
                    f"duplicate {self.kind} plugin name {name!r}: already registered by "
                    f"{self._entries[name].__module__}.{self._entries[name].__qualname__}"
                )
            if not hasattr(cls, "Config"):
                cls.Config = EmptyConfig  # type: ignore[attr-defined]
            if not dataclasses.is_dataclass(cls.Config):  # type: ignore[attr-defined]
                raise SentinelError(f"{self.kind} plugin {name!r}: Config must be a dataclass")
            cls.registry_name = name  # type: ignore[attr-defined]
            self._entries[name] = cls
            return cls

        return deco

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        import importlib

        for mod in self._builtin_modules:
            importlib.import_module(mod)
        for ep in importlib.metadata.entry_points(group=f"sentinel.{self.kind}"):
            try:
                ep.load()  # importing the module runs its @register decorators
            except Exception as exc:  # a broken third-party plugin must not break the CLI
                raise SentinelError(
                    f"entry point {ep.name!r} in group sentinel.{self.kind} failed to load: {exc}"
                ) from exc

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def get(self, name: str) -> type:
        """Return the plugin class, or raise `UnknownPluginError` naming the valid choices."""
        self._load()
        if name not in self._entries:
            valid = self.names()
            raise UnknownPluginError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, valid)}; "
                f"valid: {', '.join(valid) or '(none registered)'}"
            )
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def describe(self, name: str) -> dict[str, Any]:
        """Parameters, defaults and docs of one plugin (for `sentinel describe`)."""
        cls = self.get(name)
        params = []
        for f in dataclasses.fields(cls.Config):
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = f.default_factory()  # type: ignore[misc]
            params.append(
                {
                    "name": f.name,
                    "type": getattr(f.type, "__name__", str(f.type)),
                    "default": default,
                    "help": f.metadata.get("help", ""),
                    "range": _range(f),
                }
            )
        return {"kind": self.kind, "name": name, "doc": (cls.__doc__ or "").strip(), "params": params}


def _range(f: dataclasses.Field) -> str:
    """The field's documented range (sentinel/config.py rules; integers have a default bound)."""
    from sentinel.config import range_text

    is_int = f.type in (int, "int", "int | None")  # plug-in modules use string annotations
    return range_text(f.metadata, int if is_int else None)


def one_line(cls: type) -> str:
    """First line of a plugin's docstring."""
    return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""


# One registry per kind. The modules listed are imported on first lookup so built-ins register.
ATTACKS = Registry("attacks", ("attacks",))
DETECTORS = Registry("detectors", ("sentinel.detectors",))
AGGREGATORS = Registry("aggregators", ("sentinel.engine.aggregators",))
CODECS = Registry("codecs", ("sentinel.transport.codecs",))

REGISTRIES: dict[str, Registry] = {r.kind: r for r in (ATTACKS, DETECTORS, AGGREGATORS, CODECS)}
