"""Toolset resolution: includes, diamonds, cycles, all, unknown names; the webhook restriction."""

from __future__ import annotations

import logging

import pytest

from tools.registry import EFFECT_RUNS_COMMANDS, EFFECT_SENDS_MESSAGES, EFFECT_WRITES_FILES, registry
from toolsets import (
    TOOLSETS,
    Toolset,
    ToolsetError,
    create_custom_toolset,
    resolve_toolset,
    resolve_toolset_traced,
    toolset_for_platform,
    validate_toolset,
)


def test_includes_expand_in_order() -> None:
    assert resolve_toolset("debugging") == ["terminal", "web_search", "web_extract",
                                            "read_file", "write_file", "patch", "search_files"]


def test_diamond_has_no_duplicates() -> None:
    table = {
        "top": Toolset("", ["t"], ["left", "right"]),
        "left": Toolset("", ["l"], ["base"]),
        "right": Toolset("", ["r"], ["base"]),
        "base": Toolset("", ["b", "t"]),
    }
    assert resolve_toolset("top", toolsets=table) == ["t", "l", "b", "r"]


def test_traced_resolution_reports_every_toolset_it_read() -> None:
    table = {
        "top": Toolset("", ["t"], ["left", "right"]),
        "left": Toolset("", ["l"], ["base"]),
        "right": Toolset("", ["r"], ["base"]),
        "base": Toolset("", ["b"]),
        "unrelated": Toolset("", ["u"]),
    }
    tools, read = resolve_toolset_traced(["top", "all"], ["z"], toolsets=table)
    assert tools == ["t", "l", "b", "r", "z"]
    assert read.keys() == {"top", "left", "right", "base"}
    assert all(read[name] is table[name] for name in read)


def test_cycle_is_cut_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    table = {"a": Toolset("", ["x"], ["b"]), "b": Toolset("", ["y"], ["a"])}
    with caplog.at_level(logging.WARNING, logger="toolsets"):
        assert resolve_toolset("a", toolsets=table) == ["x", "y"]
    assert any("cycle" in r.message for r in caplog.records)


def test_self_include_cycle() -> None:
    assert resolve_toolset("s", toolsets={"s": Toolset("", ["z"], ["s"])}) == ["z"]


def test_all_and_star() -> None:
    assert resolve_toolset("all", all_tools=["b", "a"]) == ["a", "b"]
    assert resolve_toolset(["*", "web"], all_tools=["zz"]) == ["zz", "web_search", "web_extract"]


def test_unknown_toolset_raises_with_known_names() -> None:
    with pytest.raises(ToolsetError, match="unknown toolset 'nope'"):
        resolve_toolset(["web", "nope"])
    assert not validate_toolset("nope")
    assert validate_toolset("all") and validate_toolset("hermes-slack")


def test_platform_sets_and_union() -> None:
    core = resolve_toolset("hermes-core")
    for platform in ("telegram", "discord", "slack"):
        assert resolve_toolset(f"hermes-{platform}") == core
    union = set(resolve_toolset("hermes-gateway"))
    assert union == set(core) | set(resolve_toolset("hermes-webhook"))
    assert "terminal" not in resolve_toolset("safe")
    assert "cronjob" not in resolve_toolset("hermes-cron")


def test_webhook_toolset_has_no_side_effect_tools() -> None:
    registry.discover_builtin_tools()
    forbidden = {EFFECT_WRITES_FILES, EFFECT_RUNS_COMMANDS, EFFECT_SENDS_MESSAGES}
    tools = resolve_toolset("hermes-webhook")
    assert tools, "the webhook toolset is not empty"
    for name in tools:
        entry = registry.get(name)
        assert entry is not None, f"{name} is registered"
        assert not entry.effects & forbidden, f"{name} declares {sorted(entry.effects)}"
    # and the metadata is meaningful: the core set does contain such tools
    core_effects = set().union(*(registry.get(n).effects for n in resolve_toolset("hermes-core")
                                 if registry.get(n)))
    assert {EFFECT_WRITES_FILES, EFFECT_RUNS_COMMANDS} <= core_effects


def test_create_custom_toolset() -> None:
    try:
        create_custom_toolset("my-set", "mine", ["read_file"], ["web"])
        assert resolve_toolset("my-set") == ["read_file", "web_search", "web_extract"]
        with pytest.raises(ToolsetError, match="unknown toolsets: ghost"):
            create_custom_toolset("bad-set", "bad", [], ["ghost"])
        assert "bad-set" not in TOOLSETS
    finally:
        TOOLSETS.pop("my-set", None)


def test_toolset_for_platform_overrides() -> None:
    assert toolset_for_platform("telegram") == ["hermes-telegram"]
    assert toolset_for_platform("telegram", {"telegram": "safe"}) == ["safe"]
    assert toolset_for_platform("slack", {"slack": ["web", "file"]}) == ["web", "file"]
