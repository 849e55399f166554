from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
import types

import pytest

from sentinel.errors import SentinelError, UnknownPluginError
from sentinel.registry import AGGREGATORS, Registry


def test_duplicate_names_raise():
    reg = Registry("things")

    @reg.register("a")
    class A:
        """An A."""

    with pytest.raises(SentinelError, match="duplicate things plugin name 'a'"):

        @reg.register("a")
        class B:
            pass


def test_unknown_name_lists_valid_names_and_suggests():
    with pytest.raises(
        UnknownPluginError, match=r"unknown aggregators 'meen' \(did you mean 'mean'\?\); valid: .*mean"
    ):
        AGGREGATORS.get("meen")


def test_names_must_be_lower_snake():
    with pytest.raises(SentinelError, match="lower_snake"):
        Registry("x").register("BadName")


def test_entry_point_plugins_are_loaded(monkeypatch, tmp_path):
    """A third-party package's entry point is imported on first lookup, which runs its decorator."""
    reg = Registry("widgets")
    holder = types.ModuleType("widget_registry_holder")
    holder.REG = reg
    monkeypatch.setitem(sys.modules, "widget_registry_holder", holder)
    (tmp_path / "third_party_widget.py").write_text(
        "import dataclasses\n"
        "from widget_registry_holder import REG\n"
        "@REG.register('fancy')\n"
        "class Fancy:\n"
        "    '''A third-party widget.'''\n"
        "    @dataclasses.dataclass(frozen=True, kw_only=True)\n"
        "    class Config:\n"
        "        level: int = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint("fancy", "third_party_widget", "sentinel.widgets")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ep] if group == "sentinel.widgets" else [])
    assert "third_party_widget" not in sys.modules
    assert reg.names() == ["fancy"]
    info = reg.describe("fancy")
    assert info["doc"] == "A third-party widget." and info["params"][0] == {
        "name": "level",
        "type": "int",
        "default": 3,
        "help": "",
        "range": "-10000000 <= x <= 10000000",  # integers without a stated range: the default bound
    }
    assert dataclasses.is_dataclass(reg.get("fancy").Config)
    monkeypatch.delitem(sys.modules, "third_party_widget")
