"""The tool pipeline's mechanisms through model_tools' public API: the order of a call's stages, request and
execution middleware, post hooks on blocked calls, pre_llm_call context, long results stored in the workspace
(per call and per model turn) and the real tool behind ``tool_call``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import model_tools as mt
from tools.registry import registry, tool_result
from tools.result_store import PREVIEW_CHARS, RESULTS_DIR

LINE = re.compile(r"^\s*\d+\|(.*)$")


def _schema(name: str, props: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "description": "A test tool.", "parameters": {"type": "object", "properties": props or {}}}


def _add(names: list[str], name: str, handler: Any, **kw: Any) -> None:
    registry.register(name, "test-mech", kw.pop("schema", None) or _schema(name), handler, **kw)
    names.append(name)


def _echo(args: dict[str, Any], **ctx: Any) -> str:
    return tool_result(args=args)


def _text_of(size: int) -> str:
    """``size`` characters of numbered lines (the last one cut where the size ends)."""
    lines, total, i = [], 0, 0
    while total < size:
        line = f"line {i:06d} " + "abcdefghij" * 4
        lines.append(line)
        total += len(line) + 1
        i += 1
    return "\n".join(lines)[:size]


def _read_whole(path: str, ws: Path) -> str:
    """The file as the model reads it: read_file page after page, line numbers taken off."""
    registry.discover_builtin_tools()
    lines: list[str] = []
    offset: int | None = 1
    while offset is not None:
        page = json.loads(mt.handle_function_call("read_file", {"path": path, "offset": offset, "limit": 1000},
                                                  workspace=str(ws)))
        assert "error" not in page, page
        lines += [LINE.match(row).group(1) for row in page["content"].split("\n")]  # type: ignore[union-attr]
        offset = page.get("next_offset")
    return "\n".join(lines)


# -- the order of a call's stages, and middleware ------------------------------------------------------------------

def test_stages_run_in_order_with_middleware_rewriting_arguments_and_transforming_the_result(
        scratch: list[str]) -> None:
    seen: list[tuple[Any, ...]] = []

    def tool(args: dict[str, Any], **ctx: Any) -> str:
        seen.append(("tool", dict(args)))
        return tool_result(doubled=args["n"] * 2)

    def request(name: str, args: dict[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
        seen.append(("request", name, dict(args)))  # coercion came first: "4" is already 4
        return {**args, "n": args["n"] + 1}

    def execution(name: str, args: dict[str, Any], ctx: Mapping[str, Any], call_next: mt.CallNext) -> str:
        seen.append(("execution", name, dict(args)))
        result = call_next(args)
        return json.dumps({**json.loads(result), "wrapped": True})

    _add(scratch, "t_double", tool, schema=_schema("t_double", {"n": {"type": "integer"}}))
    mt.register_middleware("tool_request", request)
    mt.register_middleware("tool_execution", execution)
    mt.register_hook("pre_tool_call", lambda name, args, ctx: seen.append(("pre", name, dict(args))))
    mt.register_hook("post_tool_call", lambda name, args, result, secs, ctx: seen.append(("post", name, result)))
    mt.register_hook("transform_tool_result", lambda name, args, result: result.replace("wrapped", "final"))
    # Through the tool-search bridge: every stage sees the tool that runs, never "tool_call".
    out = mt.handle_function_call("tool_call", {"name": "t_double", "arguments": '{"n": "4"}'},
                                  enabled_tools=frozenset({"t_double"}))
    assert json.loads(out) == {"doubled": 10, "final": True}
    assert seen == [("request", "t_double", {"n": 4}), ("pre", "t_double", {"n": 5}),
                    ("execution", "t_double", {"n": 5}), ("tool", {"n": 5}),
                    ("post", "t_double", '{"doubled": 10, "wrapped": true}')]


def test_execution_middleware_nests_first_registered_outermost_and_may_change_arguments(
        scratch: list[str]) -> None:
    _add(scratch, "t_echo", _echo)

    def outer(name: str, args: dict[str, Any], ctx: Mapping[str, Any], call_next: mt.CallNext) -> str:
        return "outer(" + call_next({**args, "by": ["outer"]}) + ")"

    def inner(name: str, args: dict[str, Any], ctx: Mapping[str, Any], call_next: mt.CallNext) -> str:
        return "inner(" + call_next({**args, "by": [*args["by"], "inner"]}) + ")"

    mt.register_middleware("tool_execution", outer)
    mt.register_middleware("tool_execution", inner)
    assert mt.handle_function_call("t_echo", {}) == 'outer(inner({"args": {"by": ["outer", "inner"]}}))'
    mt.unregister_middleware("tool_execution", inner)
    assert mt.handle_function_call("t_echo", {}) == 'outer({"args": {"by": ["outer"]}})'


def test_failing_middleware_is_skipped_and_the_tool_runs_once(scratch: list[str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    _add(scratch, "t_count", lambda args, **ctx: runs.append(1) or f"run {len(runs)}")

    def raises_first(name: str, args: dict[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
        raise RuntimeError("request bug")

    def retries(name: str, args: dict[str, Any], ctx: Mapping[str, Any], call_next: mt.CallNext) -> str:
        call_next(args)
        return call_next(args)  # a second run is refused: the first one's result stands

    def breaks_before(name: str, args: dict[str, Any], ctx: Mapping[str, Any], call_next: mt.CallNext) -> str:
        raise RuntimeError("execution bug")

    def not_a_string(name: str, args: dict[str, Any], ctx: Mapping[str, Any], call_next: mt.CallNext) -> Any:
        return {"result": call_next(args)}

    mt.register_middleware("tool_request", raises_first)
    mt.register_middleware("tool_request", lambda name, args, ctx: ["not", "arguments"])
    for middleware in (retries, breaks_before, not_a_string):
        mt.register_middleware("tool_execution", middleware)
    assert mt.handle_function_call("t_count", {}) == "run 1"
    assert runs == [1]
    logged = caplog.text
    for why in ("request bug", "not arguments", "call_next was called twice", "execution bug", "not the result"):
        assert why in logged


def test_unknown_kinds_are_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="pre_llm_call, pre_tool_call"):
        mt.register_hook("pre_model_call", lambda *a: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool_request, tool_execution"):
        mt.register_middleware("pre_tool_call", lambda *a: None)  # type: ignore[arg-type]


# -- blocked calls -------------------------------------------------------------------------------------------------

def test_a_blocked_call_still_fires_post_tool_call_marked_blocked(scratch: list[str]) -> None:
    ran: list[str] = []
    posts: list[tuple[str, str, float, bool]] = []
    _add(scratch, "t_guarded", lambda args, **ctx: ran.append("guarded") or "ran")
    _add(scratch, "t_free", lambda args, **ctx: ran.append("free") or "ran")
    mt.register_hook("pre_tool_call", lambda name, args, ctx: "blocked by policy" if name == "t_guarded" else None)
    mt.register_hook("post_tool_call", lambda name, args, result, secs, ctx: posts.append(
        (name, result, secs, ctx.get("blocked", False))))
    mt.register_hook("transform_tool_result", lambda name, args, result: result.upper())
    assert json.loads(mt.handle_function_call("t_guarded", {}, run_id="r1")) == {"ERROR": "BLOCKED BY POLICY"}
    assert mt.handle_function_call("t_free", {}) == "RAN"
    assert ran == ["free"]
    assert posts == [("t_guarded", '{"error": "blocked by policy"}', 0.0, True), ("t_free", "ran", posts[1][2], False)]


# -- pre_llm_call --------------------------------------------------------------------------------------------------

def test_pre_llm_call_texts_are_joined_and_failures_skipped(scratch: list[str],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[int, str]] = []

    def broken(messages: list[dict[str, Any]], ctx: Mapping[str, Any]) -> str:
        raise RuntimeError("hook bug")

    assert not mt.has_hooks("pre_llm_call")
    mt.register_hook("pre_llm_call", lambda messages, ctx: seen.append((len(messages), ctx["user_key"])) or None)
    mt.register_hook("pre_llm_call", broken)
    mt.register_hook("pre_llm_call", lambda messages, ctx: "  The user is in Oslo.  ")
    mt.register_hook("pre_llm_call", lambda messages, ctx: "It is raining.")
    assert mt.has_hooks("pre_llm_call")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    assert mt.llm_call_context(messages, {"user_key": "tg:1"}) == "The user is in Oslo.\n\nIt is raining."
    assert seen == [(2, "tg:1")] and "hook bug" in caplog.text


# -- long results --------------------------------------------------------------------------------------------------

def test_a_500_kb_result_is_stored_whole_and_the_model_gets_a_preview_it_can_follow(scratch: list[str],
                                                                                    tmp_path: Path) -> None:
    big = _text_of(500_000)
    _add(scratch, "t_big", lambda args, **ctx: big)
    ws = tmp_path / "workspace"
    out = json.loads(mt.handle_function_call("t_big", {}, workspace=str(ws), run_id="run-1",
                                             tool_call_id="call_7"))
    path = out["saved_to"]
    assert path == "/".join((*RESULTS_DIR, "run-1", "call_7.txt"))
    assert out["characters"] == 500_000 and out["lines"] == big.count("\n") + 1
    assert big.startswith(out["preview"]) and 0 < len(out["preview"]) <= PREVIEW_CHARS
    assert path in out["note"] and "read_file" in out["note"]
    assert (ws / path).read_text(encoding="utf-8") == big
    assert _read_whole(path, ws) == big
    # The same call id again (some servers number calls per turn): a new file, the first one kept.
    again = json.loads(mt.handle_function_call("t_big", {}, workspace=str(ws), run_id="run-1", tool_call_id="call_7"))
    assert again["saved_to"].endswith("call_7-1.txt") and (ws / path).read_text(encoding="utf-8") == big


def test_the_tools_own_limit_decides_and_without_a_workspace_the_result_is_cut(scratch: list[str],
                                                                               tmp_path: Path) -> None:
    _add(scratch, "t_small_limit", lambda args, **ctx: "x" * 5000, max_result_size_chars=1000)
    _add(scratch, "t_default", lambda args, **ctx: "y" * 90_000)
    ws = tmp_path / "ws"
    assert mt.handle_function_call("t_default", {}, workspace=str(ws)) == "y" * 90_000  # under the default
    stored = json.loads(mt.handle_function_call("t_small_limit", {}, workspace=str(ws), tool_call_id="c1"))
    assert stored["characters"] == 5000 and len(stored["preview"]) == 1000
    cut = mt.handle_function_call("t_small_limit", {})
    assert len(cut) == 1000 and cut.endswith("[... truncated: showing 1000 of 5000 characters]")


def test_a_run_without_a_tool_to_read_files_gets_the_result_cut_not_a_path(scratch: list[str],
                                                                          tmp_path: Path) -> None:
    """A webhook run (web tools only) cannot open a stored file: pointing it at one would lose the rest."""
    _add(scratch, "t_long", lambda args, **ctx: "z" * 5000, max_result_size_chars=1000)
    ws = tmp_path / "ws"
    cut = mt.handle_function_call("t_long", {}, enabled_tools=frozenset({"t_long", "web_search"}), workspace=str(ws))
    assert len(cut) == 1000 and "truncated" in cut and not (ws / RESULTS_DIR[0]).exists()
    stored = json.loads(mt.handle_function_call("t_long", {}, enabled_tools=frozenset({"t_long", "read_file"}),
                                                workspace=str(ws), tool_call_id="c2"))
    assert (ws / stored["saved_to"]).read_text(encoding="utf-8") == "z" * 5000
    texts = mt.cap_turn_results([mt.TurnResult("t_long", "c3", "q" * 20_000)], 10_000, {"workspace": str(ws)},
                                frozenset({"t_long"}))
    assert len(texts[0]) <= 10_000 and "saved_to" not in texts[0]


def test_a_symlink_planted_in_the_workspace_is_not_followed(scratch: list[str], tmp_path: Path) -> None:
    """The workspace is the sandboxed tools' to change: a link there must not send the gateway's write elsewhere."""
    _add(scratch, "t_big", lambda args, **ctx: "z" * 150_000)
    ws, outside = tmp_path / "ws", tmp_path / "gateway-home"
    ws.mkdir()
    outside.mkdir()
    (ws / ".hermes").symlink_to(outside)
    out = mt.handle_function_call("t_big", {}, workspace=str(ws), run_id="r", tool_call_id="c")
    assert out.endswith("[... truncated: showing 100000 of 150000 characters]")
    assert list(outside.iterdir()) == []
    (ws / ".hermes").unlink()
    (ws / ".hermes" / "tool_results").mkdir(parents=True)
    (ws / ".hermes" / "tool_results" / "r").symlink_to(outside)
    mt.handle_function_call("t_big", {}, workspace=str(ws), run_id="r", tool_call_id="c")
    assert list(outside.iterdir()) == []


def test_unsafe_ids_make_safe_file_names(scratch: list[str], tmp_path: Path) -> None:
    _add(scratch, "t_big", lambda args, **ctx: "q" * 150_000)
    ws = tmp_path / "ws"
    out = json.loads(mt.handle_function_call("t_big", {}, workspace=str(ws), run_id="../../etc",
                                             tool_call_id="../passwd"))
    assert out["saved_to"] == ".hermes/tool_results/_etc/_passwd.txt"
    assert (ws / out["saved_to"]).stat().st_size == 150_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]


def test_results_are_readable_by_another_user_whatever_the_umask(scratch: list[str], tmp_path: Path) -> None:
    """The sandbox's user differs from the gateway's when the gateway runs as root."""
    _add(scratch, "t_big", lambda args, **ctx: "w" * 150_000)
    ws = tmp_path / "ws"
    old = os.umask(0o077)
    try:
        out = json.loads(mt.handle_function_call("t_big", {}, workspace=str(ws), run_id="r", tool_call_id="c"))
    finally:
        os.umask(old)
    file = ws / out["saved_to"]
    assert file.stat().st_mode & 0o777 == 0o644
    assert (ws / ".hermes").stat().st_mode & 0o777 == 0o755 and file.parent.stat().st_mode & 0o777 == 0o755


def test_a_turns_results_are_capped_together_largest_first(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    texts = [_text_of(90_000), _text_of(30_000), "small", _text_of(120_000)]
    turn = [mt.TurnResult(f"tool{i}", f"call_{i}", text) for i, text in enumerate(texts)]
    capped = mt.cap_turn_results(turn, 200_000, {"workspace": str(ws), "run_id": "r9"})
    assert capped[1:3] == texts[1:3]  # the largest (call_3) was enough
    stored = json.loads(capped[3])
    assert stored["saved_to"] == ".hermes/tool_results/r9/call_3.txt" and (ws / stored["saved_to"]).read_text() == \
        texts[3]
    assert capped[0] == texts[0] and sum(map(len, capped)) <= 200_000
    tight = mt.cap_turn_results(turn, 10_000, {"workspace": str(ws), "run_id": "r9"})
    assert [json.loads(t)["characters"] for t in (tight[0], tight[1], tight[3])] == [90_000, 30_000, 120_000]
    assert tight[2] == "small"  # too small to gain from storing
    assert mt.cap_turn_results(turn, 1_000_000, {"workspace": str(ws)}) == texts
    cut = mt.cap_turn_results(turn, 200_000, {})  # no workspace: the largest are cut instead
    assert len(cut[3]) == PREVIEW_CHARS and cut[3].endswith("of 120000 characters]")


# -- the real tool behind tool_call --------------------------------------------------------------------------------

def test_real_call_names_the_tool_behind_tool_call() -> None:
    assert mt.real_call("tool_call", '{"name": "web_search", "arguments": {"query": "x"}}') == (
        "web_search", '{"query": "x"}')
    assert mt.real_call("tool_call", '{"name": "terminal", "arguments": "{\\"command\\": \\"ls\\"}"}') == (
        "terminal", '{"command": "ls"}')
    assert mt.real_call("tool_call", '{"name": "web_search"}') == ("web_search", "{}")
    for broken in ("{nope", '{"arguments": {}}', '{"name": 3}'):
        assert mt.real_call("tool_call", broken) == ("tool_call", broken)
    assert mt.real_call("read_file", '{"path": "a"}') == ("read_file", '{"path": "a"}')
