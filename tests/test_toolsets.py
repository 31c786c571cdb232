"""Toolset resolution: includes, diamonds, cycles, all, unknown names, plugin platforms; the webhook restriction."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tools.registry import EFFECT_RUNS_COMMANDS, EFFECT_SENDS_MESSAGES, EFFECT_WRITES_FILES, registry
from toolsets import (
    TOOLSETS,
    Toolset,
    ToolsetError,
    create_custom_toolset,
    remove_source_toolset,
    resolve_toolset,
    resolve_toolset_traced,
    set_plugin_platform_toolset,
    set_source_toolset,
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
    tools, read = resolve_toolset_traced(["top", "gone"], toolsets=table)
    assert tools == ["t", "l", "b", "r"]
    assert read.keys() == {"top", "left", "right", "base", "gone"}
    assert all(read[name] is table[name] for name in read if name != "gone")
    assert read["gone"] is None  # holds while the name stays unknown
    tools, read = resolve_toolset_traced(["top", "all"], toolsets=table)
    assert tools == ["t", "l", "b", "r", "u"]
    assert read.keys() == table.keys()  # all: every toolset of the table


def test_cycle_is_cut_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    table = {"a": Toolset("", ["x"], ["b"]), "b": Toolset("", ["y"], ["a"])}
    with caplog.at_level(logging.WARNING, logger="toolsets"):
        assert resolve_toolset("a", toolsets=table) == ["x", "y"]
    assert any("cycle" in r.message for r in caplog.records)


def test_self_include_cycle() -> None:
    assert resolve_toolset("s", toolsets={"s": Toolset("", ["z"], ["s"])}) == ["z"]


@pytest.fixture
def source_toolsets() -> Iterator[list[str]]:
    """Names of runtime toolsets a test makes, removed at teardown (the table is process-wide)."""
    made: list[str] = []
    yield made
    for name in made:
        remove_source_toolset(name)


def test_all_and_star_are_the_union_of_every_toolset(source_toolsets: list[str]) -> None:
    set_source_toolset("plugin-dice", "a plugin's tools", ["roll_dice"])
    set_source_toolset("mcp-notes", "an MCP server's tools", ["note_add", "read_file"])
    source_toolsets += ["plugin-dice", "mcp-notes"]
    union = set().union(*(resolve_toolset(name) for name in TOOLSETS))
    assert {"roll_dice", "note_add", "terminal", "web_search"} <= union
    assert resolve_toolset("all") == sorted(union)
    assert resolve_toolset("*") == resolve_toolset("all")
    # Named toolsets keep their order; "all" adds what they did not name, sorted.
    assert resolve_toolset(["web", "all"])[:2] == ["web_search", "web_extract"]
    assert sorted(resolve_toolset(["web", "all"])) == sorted(union)
    remove_source_toolset("plugin-dice")
    assert "roll_dice" not in resolve_toolset("all")


def test_unknown_toolset_resolves_to_nothing_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="toolsets"):
        assert resolve_toolset(["web", "no-such-set"]) == ["web_search", "web_extract"]
        assert resolve_toolset("no-such-set") == []
        assert resolve_toolset_traced(["no-such-set"])[1] == {"no-such-set": None}
    assert [r.getMessage() for r in caplog.records].count(
        "unknown toolset 'no-such-set' resolves to no tools; known: " + ", ".join(sorted(TOOLSETS))) == 1
    assert not validate_toolset("no-such-set")
    assert validate_toolset("all") and validate_toolset("hermes-slack")


def test_a_plugin_platform_gets_core_plus_its_plugins_tools(source_toolsets: list[str]) -> None:
    assert resolve_toolset("hermes-relayx") == []  # no such platform yet
    set_source_toolset("plugin-relayx", "a plugin's tools", ["relay_shout", "read_file"])
    assert set_plugin_platform_toolset("relayx", "plugin-relayx") is not None
    source_toolsets += ["plugin-relayx", "hermes-relayx"]
    assert resolve_toolset("hermes-relayx") == [*resolve_toolset("hermes-core"), "relay_shout"]
    assert "relay_shout" in resolve_toolset("all")
    # The plugin's toolset changing (a reload) shows at once.
    set_source_toolset("plugin-relayx", "a plugin's tools", ["relay_whisper"])
    assert resolve_toolset("hermes-relayx")[-1] == "relay_whisper"
    # A toolset defined otherwise is never replaced.
    telegram = TOOLSETS["hermes-telegram"]
    assert set_plugin_platform_toolset("telegram", "plugin-relayx") is None
    assert TOOLSETS["hermes-telegram"] is telegram
    remove_source_toolset("hermes-relayx")
    assert "hermes-relayx" not in TOOLSETS
    remove_source_toolset("hermes-telegram")  # not made for a plugin platform: stays
    assert TOOLSETS["hermes-telegram"] is telegram


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
