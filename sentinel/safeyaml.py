"""Bounded, strict YAML: `yaml.SafeLoader` plus the checks a scenario file needs before it is trusted.

Still only safe tags (no `!!python/...`: a `SafeLoader` subclass). On top of PyYAML it refuses:

- **duplicate keys** in one mapping (PyYAML keeps the last silently), naming both locations;
- **deep nesting**: more than `MAX_DEPTH` levels of mappings and lists (PyYAML composes recursively,
  so 5,000 levels end in a RecursionError);
- **recursive aliases** (`&a [*a]`) and **alias bombs**: documents that expand to more than
  `MAX_NODES` values once aliases are followed (every later step walks the expanded tree);
- **large texts**: more than `MAX_BYTES` (scenario files are a few kB);
- **non-JSON values**: `!!binary`, `!!set`, `!!omap`, `!!pairs` and `!!timestamp` tags; unquoted dates
  stay strings.

Every refusal is a `ConfigError` located as `SOURCE: line L, column C: ...`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

from sentinel.errors import ConfigError

MAX_DEPTH = 64  # nesting levels of mappings / lists; the scenario schema needs 6
MAX_NODES = 100_000  # values after alias expansion; the largest library scenario has ~300
MAX_BYTES = 1 << 20  # 1 MiB of YAML text


def _where(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"


class StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader with a depth bound and duplicate-key detection (see the module docstring)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # noqa: D102  (PyYAML hook)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # noqa: D102  (PyYAML hook)
        if isinstance(node, MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may override keys on purpose
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # unhashable key: PyYAML reports it below
                    continue
                if first is not key_node.start_mark:
                    raise ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"duplicate key {key!r} (first at {_where(first)}); keep one",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


class YAMLProblem(ConfigError):
    """Text that is not YAML within the bounds; `detail` is the located problem without the source."""

    def __init__(self, source: str, detail: str):
        self.detail = detail
        super().__init__(f"{source}: malformed YAML: {detail}")


# Plain data only: dates read as strings (YAML 1.1 turns `2024-01-02` into a date), and the tags that build
# bytes, sets, dates or ordered pairs are refused like any unknown tag (a scenario holds JSON-like values).
StrictSafeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictSafeLoader.yaml_constructors = {
    tag: fn
    for tag, fn in yaml.SafeLoader.yaml_constructors.items()
    if tag not in {f"tag:yaml.org,2002:{t}" for t in ("timestamp", "binary", "set", "omap", "pairs")}
}


def _count_nodes(root: Node | None) -> None:
    """Raise ComposerError for a recursive alias or more than MAX_NODES values after alias expansion."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ComposerError(None, None, "recursive alias (a value that contains itself)", node.start_mark)
        active.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                raise ComposerError(None, None, f"expands to more than {MAX_NODES:,} values (aliases)", node.start_mark)
        active.discard(key)
        sizes[key] = total
        return total

    if root is not None:
        size(root)  # depth <= MAX_DEPTH, so this recursion is bounded


def loads(text: str, source: str = "<string>") -> Any:
    """Parse one YAML document with the bounds above; ConfigError located in `source` on any problem."""
    if len(text) > MAX_BYTES:
        raise ConfigError(
            f"{source}: {len(text):,} characters of YAML is more than the {MAX_BYTES:,} allowed; "
            "a scenario file is a few kB"
        )
    loader = None
    try:
        loader = StrictSafeLoader(text)
        node = loader.get_single_node()
        _count_nodes(node)
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YAMLProblem(source, (f"{_where(mark)}: " if mark is not None else "") + problem) from None
    except RecursionError:  # a structure the bounds above did not catch; never a traceback
        raise YAMLProblem(source, "nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_file(path: str | Path, what: str = "scenario file") -> Any:
    """Read and parse a YAML file: found, a regular file, at most MAX_BYTES, UTF-8, then `loads`."""
    path = Path(path)
    try:
        if not path.is_file():
            raise ConfigError(f"{path}: {what} not found" + (" (it is a folder)" if path.is_dir() else ""))
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise ConfigError(f"{path}: cannot read {what} ({exc})") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES:,} bytes; a {what} is a few kB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})") from None
    return loads(text, str(path))
