"""The tool pipeline's mechanisms in the running gateway, against the scripted model: a 500 KB result behind tool
search stored in the workspace and read back whole with read_file, the real tool's name in the run's records,
metrics and progress, the per-turn cap, the approval gate judging the tool behind ``tool_call``, and
``pre_llm_call`` context that reaches the model's request but not the transcript."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import model_tools
from gateway.sim.model_server import JSON, ToolCall, Turn, text, tool_call, tool_calls
from tests.conftest import GatewayFactory, Harness
from tests.sandbox_support import write_plugin

LINE = re.compile(r"^\s*\d+\|(.*)$")
DANGEROUS = "rm -rf build/"


def report(size: int) -> str:
    """The plugin tool's output: ``size`` characters of numbered lines (the same function runs in the plugin)."""
    return "\n".join(f"row {i:06d} " + "0123456789" * 4 for i in range(size // 51 + 1))[:size]


PLUGIN = inspect.getsource(report) + textwrap.dedent('''
    def _bulk(args, **ctx):
        return report(int(args.get("size", 500_000)))

    def register(registry):
        registry.register("bulk_output", "plugin-bulk", {
            "description": "Prints the long inventory report.",
            "parameters": {"type": "object", "properties": {"size": {"type": "integer"}}},
        }, _bulk, emoji="📦")
    ''')


def _with_bulk(home: Path, **extra: Any) -> dict[str, Any]:
    """Config overrides: the bulk plugin, its toolset added to telegram's, progress shown at once."""
    write_plugin(home / "plugins", "bulk", PLUGIN)
    return {"plugins": {"dir": str(home / "plugins"), "entry_points": False},
            "toolsets": {"telegram": ["hermes-telegram", "plugin-bulk"]},
            "platforms": {"telegram": {"tool_progress_delay": 0}}, **extra}


async def _reply(h: Harness, says: str) -> dict[str, Any]:
    accepted = await h.chat.user_says(says)
    return await h.wait_run(accepted.run_id, timeout=60)


class Reader:
    """A model that asks for the bulk report through tool search, then reads the stored file with read_file page by
    page, keeping the lines it read."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.notice: dict[str, Any] = {}

    def __call__(self, request: JSON) -> Turn:
        last = request["messages"][-1]
        if last["role"] == "user":
            return tool_call("tool_call", {"name": "bulk_output", "arguments": {"size": 500_000}})
        result = json.loads(last["content"])
        if "saved_to" in result:
            self.notice = result
            return tool_call("read_file", {"path": result["saved_to"], "offset": 1, "limit": 5000})
        assert "error" not in result, result
        self.lines += [LINE.match(row).group(1) for row in result["content"].split("\n")]  # type: ignore[union-attr]
        if "next_offset" in result:
            return tool_call("read_file", {"path": result["path"], "offset": result["next_offset"], "limit": 5000})
        return text(f"The report has {len(self.lines)} lines.")


async def test_a_500_kb_result_behind_tool_search_is_stored_and_read_back_whole(make_gateway: GatewayFactory,
                                                                               tmp_path: Path) -> None:
    reader = Reader()
    h = await make_gateway(_with_bulk(tmp_path, tool_search={"threshold": 0}, model={"max_turns": 20}),
                           responder=reader)
    run = await _reply(h, "send me the inventory report")
    assert run["status"] == "completed", run
    expected = report(500_000)
    offered = {t["function"]["name"] for t in h.model.requests[0]["tools"]}
    assert {"tool_search", "tool_call"} <= offered and "bulk_output" not in offered  # deferred behind search
    # The model saw a preview and the path; the file holds the whole result; read_file gave all of it back.
    notice = reader.notice
    call_id = h.model.requests[1]["messages"][-2]["tool_calls"][0]["id"]  # the model's tool_call
    assert notice["saved_to"] == f".hermes/tool_results/{run['id']}/{call_id}.txt"
    assert notice["characters"] == 500_000 and expected.startswith(notice["preview"])
    assert (tmp_path / "workspace" / notice["saved_to"]).read_text(encoding="utf-8") == expected
    assert "\n".join(reader.lines) == expected
    assert run["result"] == f"The report has {expected.count(chr(10)) + 1} lines."
    # The run's records, the latency metric and the progress line name the tool behind tool_call.
    first = run["tool_calls"][0]
    assert (first["name"], first["via"], json.loads(first["arguments"])) == ("bulk_output", "tool_call",
                                                                            {"size": 500_000})
    assert first["result"].startswith('{"saved_to"')
    assert {c["name"] for c in run["tool_calls"][1:]} == {"read_file"}
    metrics = h.gateway.metrics.render().decode()
    assert 'hermes_tool_call_seconds_count{tool="bulk_output"} 1.0' in metrics
    assert 'tool="tool_call"' not in metrics
    shown = [s.text for s in h.chat.sent] + [edit for s in h.chat.sent for edit in s.edits]
    assert any(line.startswith("📦 bulk_output") for t in shown for line in t.split("\n")), shown


async def test_a_turns_results_over_the_cap_are_stored_largest_first(make_gateway: GatewayFactory,
                                                                    tmp_path: Path) -> None:
    sizes = (8_000, 5_000, 1_000)

    def model(request: JSON) -> Turn:
        if request["messages"][-1]["role"] == "user":
            return tool_calls(ToolCall("bulk_output", json.dumps({"size": size}), f"call_{size}") for size in sizes)
        return text("done")

    h = await make_gateway(_with_bulk(tmp_path, tools={"max_turn_result_chars": 10_000}), responder=model)
    run = await _reply(h, "three reports")
    assert run["status"] == "completed", run
    shown = {m["tool_call_id"]: m["content"] for m in h.model.requests[1]["messages"] if m["role"] == "tool"}
    stored = json.loads(shown["call_8000"])
    assert stored["saved_to"] == f".hermes/tool_results/{run['id']}/call_8000.txt"
    assert (tmp_path / "workspace" / stored["saved_to"]).read_text(encoding="utf-8") == report(8_000)
    assert shown["call_5000"] == report(5_000) and shown["call_1000"] == report(1_000)
    assert sum(map(len, shown.values())) <= 10_000
    assert run["tool_calls"][0]["result"].startswith('{"saved_to"')  # the record holds what the model saw


async def test_stored_results_older_than_the_retention_window_are_removed(make_gateway: GatewayFactory,
                                                                          tmp_path: Path) -> None:
    """``store.retention.tool_results``: a run's stored results go once the newest is older than the window; a
    younger run's stay, and so does anything a tool links there (the link is removed, never followed)."""
    def model(request: JSON) -> Turn:
        if request["messages"][-1]["role"] == "user":
            return tool_calls([ToolCall("bulk_output", json.dumps({"size": 200_000}), "call_big")])
        return text("stored")

    h = await make_gateway(_with_bulk(tmp_path, store={"retention": {"tool_results": "1h", "interval": "0.1s"}}),
                           responder=model)
    results = tmp_path / "workspace" / ".hermes" / "tool_results"
    old, new = (await _reply(h, "a report")), (await _reply(h, "another report"))
    keep = tmp_path / "outside.txt"
    keep.write_text("not the gateway's to remove")
    (results / old["id"] / "link").symlink_to(keep)
    two_hours_ago = time.time() - 7200
    os.utime(results / old["id"], (two_hours_ago, two_hours_ago))
    async with asyncio.timeout(10):  # the pruner's next round (every 0.1 s)
        while (results / old["id"]).exists():
            await asyncio.sleep(0.05)
    assert (results / new["id"] / "call_big.txt").read_text(encoding="utf-8") == report(200_000)
    assert keep.read_text() == "not the gateway's to remove"


async def test_the_approval_gate_judges_the_tool_behind_tool_call(make_gateway: GatewayFactory,
                                                                 tmp_path: Path) -> None:
    """tool_call must not be a way around the approvals: a webhook run cannot ask, so the command is refused."""
    build = tmp_path / "workspace" / "build"
    build.mkdir(parents=True)

    def model(request: JSON) -> Turn:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return text(f"Result: {last['content']}")
        return tool_call("tool_call", {"name": "terminal", "arguments": {"command": DANGEROUS}})

    h = await make_gateway({"platforms": {"webhook": {
        "allowed_toolsets": ["hermes-webhook", "terminal"], "routes": {"github": {"toolset": ["terminal"]}}}}},
        responder=model)
    status, body = await h.post_webhook()
    assert status == 202
    run = await h.wait_run(body["run_id"], timeout=30)
    assert "cannot ask anyone to approve this" in run["result"] and "terminal:" in run["result"], run["result"]
    assert build.exists()
    assert (run["tool_calls"][0]["name"], run["tool_calls"][0]["approval"]) == ("terminal", "deny")


async def test_pre_llm_call_context_reaches_the_request_but_not_the_transcript(make_gateway: GatewayFactory) -> None:
    seen: list[Mapping[str, Any]] = []

    def weather(messages: list[dict[str, Any]], ctx: Mapping[str, Any]) -> str:
        seen.append(ctx)
        return f"(Context: it is raining where {ctx['user_key']} is.)"

    model_tools.register_hook("pre_llm_call", weather)
    try:
        h = await make_gateway(responder=lambda request: text("noted"))
        await _reply(h, "hello")
        await _reply(h, "and again")
    finally:
        model_tools.unregister_hook("pre_llm_call", weather)
    context = "(Context: it is raining where telegram:1001 is.)"
    first, second = h.model.requests
    assert first["messages"][-1] == {"role": "user", "content": f"hello\n\n{context}"}
    users = [m["content"] for m in second["messages"] if m["role"] == "user"]
    assert users == ["hello", f"and again\n\n{context}"]  # the earlier turn came back from the transcript without it
    assert [c["run_id"] for c in seen] != [] and all(c["session_key"] == seen[0]["session_key"] for c in seen)
