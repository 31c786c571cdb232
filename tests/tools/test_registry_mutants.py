"""Registry rules that ``make mutate`` found unpinned: each test names the mutant of ``tools/registry.py`` it kills."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from tools.registry import (
    CHECK_FN_TTL_SECONDS,
    ISOLATION_PROCESS,
    MAX_ERROR_CHARS,
    RESULT_CEILING_CHARS,
    ToolEntry,
    ToolRegistry,
    sanitize_error_text,
    tool_error,
    tool_result,
    truncate_result,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeSandbox:
    """A SandboxRunner that records its calls."""

    def __init__(self, reason: str | None = None, answer: str = "from the sandbox") -> None:
        self.reason, self.answer = reason, answer
        self.runs: list[tuple[ToolEntry, dict[str, Any], Mapping[str, Any]]] = []

    def unavailable_reason(self, entry: ToolEntry) -> str | None:
        return self.reason

    def run(self, entry: ToolEntry, args: dict[str, Any], ctx: Mapping[str, Any]) -> str:
        self.runs.append((entry, args, ctx))
        return self.answer


def _schema(name: str) -> dict[str, Any]:
    return {"name": name, "description": "A tool.", "parameters": {"type": "object", "properties": {}}}


def _here(args: dict[str, Any], **ctx: Any) -> str:
    return "ran in the gateway"


@pytest.fixture
def reg() -> ToolRegistry:
    return ToolRegistry(clock=FakeClock())


def test_a_sandboxed_tool_runs_in_the_sandbox_with_its_arguments_and_context(reg: ToolRegistry) -> None:
    """Kills dispatch's mutants that skip the sandbox (``sandbox = None``, ``isolation != ISOLATION_SANDBOX``,
    ``reason if ... or True``) or hand it the wrong call (``run(None, ...)``, ``run(entry, None, ctx)``,
    ``dict(None)``, ``run(entry, dict(args), None)``, arguments left out)."""
    sandbox = FakeSandbox()
    reg.sandbox = sandbox
    reg.register("probe", "file", _schema("probe"), _here)
    assert reg.dispatch("probe", {"path": "a.txt"}, session_key="s1") == "from the sandbox"
    ((entry, args, ctx),) = sandbox.runs
    assert entry is reg.get("probe")
    assert args == {"path": "a.txt"} and type(args) is dict
    assert dict(ctx) == {"session_key": "s1"}


def test_a_process_tool_runs_in_the_gateway_even_with_a_sandbox(reg: ToolRegistry) -> None:
    """Kills dispatch's ``entry.isolation != ISOLATION_SANDBOX`` (the gateway's own tools sent to the sandbox)."""
    sandbox = FakeSandbox()
    reg.sandbox = sandbox
    reg.register("memo", "memory", _schema("memo"), _here, isolation=ISOLATION_PROCESS)
    assert reg.dispatch("memo", {}) == "ran in the gateway"
    assert sandbox.runs == []


def test_a_sandboxed_tool_the_sandbox_cannot_run_is_an_error_naming_why(reg: ToolRegistry) -> None:
    """Kills dispatch's ``reason = None``, ``unavailable_reason(None)`` (the sandbox asked about no tool),
    ``if (reason) and False`` (runs anyway) and ``tool_error(None)`` (an error without the reason)."""

    class NoNetworkSandbox(FakeSandbox):
        def unavailable_reason(self, entry: ToolEntry) -> str | None:
            return "no network in this sandbox" if entry is not None and entry.network else None

    sandbox = NoNetworkSandbox()
    reg.sandbox = sandbox
    reg.register("fetch", "web", _schema("fetch"), _here, network=True)
    answer = json.loads(reg.dispatch("fetch", {}))
    assert answer == {"error": "fetch is unavailable: no network in this sandbox"}
    assert sandbox.runs == []


def test_a_sandboxed_result_comes_whole_up_to_the_ceiling(reg: ToolRegistry) -> None:
    """Kills dispatch's ``truncate_result(text, None)``, ``(text, )`` and ``(None, ...)``; a result over the tool's
    own limit comes whole (model_tools stores it), one over the ceiling is cut there."""
    reg.sandbox = FakeSandbox(answer="x" * 500)
    reg.register("probe", "file", _schema("probe"), _here, max_result_size_chars=200)
    assert reg.dispatch("probe", {}) == "x" * 500
    reg.sandbox = FakeSandbox(answer="x" * (RESULT_CEILING_CHARS + 500))
    text = reg.dispatch("probe", {})
    assert len(text) == RESULT_CEILING_CHARS
    assert text.endswith(f"[... truncated: showing {RESULT_CEILING_CHARS} of {RESULT_CEILING_CHARS + 500} characters]")


def test_availability_asks_the_sandbox_for_sandboxed_tools_only(reg: ToolRegistry) -> None:
    """Kills unavailable_reason's ``sandbox = None``, ``isolation != ISOLATION_SANDBOX`` and
    ``sandbox.unavailable_reason(None)`` (a tool offered that the sandbox cannot run)."""

    class PickySandbox(FakeSandbox):
        def unavailable_reason(self, entry: ToolEntry) -> str | None:
            return "needs bubblewrap" if entry is not None and entry.name == "probe" else None

    reg.sandbox = PickySandbox()
    reg.register("probe", "file", _schema("probe"), _here)
    reg.register("memo", "memory", _schema("memo"), _here, isolation=ISOLATION_PROCESS)
    assert reg.unavailable_reason("probe") == "needs bubblewrap"
    assert reg.unavailable_reason("memo") is None
    assert reg.available(["probe", "memo"]) == ["memo"]


def test_removing_a_toolset_moves_the_generation_forward(reg: ToolRegistry) -> None:
    """Kills deregister_toolset's ``_generation = 1`` and ``_generation -= 1`` (caches keyed on the generation
    would keep serving the removed tools)."""
    for name in ("a", "b", "c"):
        reg.register(name, "mcp-x", _schema(name), _here)
    before = reg.generation
    assert sorted(reg.deregister_toolset("mcp-x")) == ["a", "b", "c"]
    assert reg.generation > before


def test_a_definition_keeps_its_registered_name(reg: ToolRegistry) -> None:
    """Kills get_definitions' ``k != "XXnameXX"`` and ``k != "NAME"`` (a schema's own "name" would replace the
    name the tool is registered and dispatched under)."""
    reg.register("read_notes", "file", {**_schema("read_notes"), "name": "something_else"}, _here)
    (definition,) = reg.get_definitions(["read_notes"])
    assert definition["function"]["name"] == "read_notes"


def test_a_tool_registered_after_the_snapshot_does_not_hide_the_rest(reg: ToolRegistry,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills get_definitions' ``continue`` -> ``break`` (one tool registered while definitions are built would
    drop every tool sorted after it)."""
    reg.register("b_tool", "file", _schema("b_tool"), _here)
    monkeypatch.setattr(reg, "available", lambda names: ["a_new", "b_tool"])  # a_new is not in the snapshot
    assert [d["function"]["name"] for d in reg.get_definitions(["a_new", "b_tool"])] == ["b_tool"]


def test_a_probe_is_trusted_for_less_than_its_ttl(reg: ToolRegistry) -> None:
    """Kills _check_fn_cached's ``now - cached[0] <= CHECK_FN_TTL_SECONDS`` (a probe trusted one tick too long)."""
    clock = reg._clock
    assert isinstance(clock, FakeClock)
    calls: list[float] = []

    def probe() -> bool:
        calls.append(clock.now)
        return True

    reg.register("probed", "web", _schema("probed"), _here, check_fn=probe, isolation=ISOLATION_PROCESS)
    assert reg.is_available("probed")
    clock.now += CHECK_FN_TTL_SECONDS
    assert reg.is_available("probed")
    assert len(calls) == 2


def test_results_and_errors_keep_non_ascii_text(reg: ToolRegistry) -> None:
    """Kills ``ensure_ascii=True`` / ``None`` / left out in tool_error, tool_result and run_here's JSON of a
    handler's structured result (the model would get ``\\u00e9`` escapes for every accented letter)."""
    assert tool_error("fichier introuvable: café.txt") == '{"error": "fichier introuvable: café.txt"}'
    assert tool_result(name="café") == '{"name": "café"}'
    reg.register("dict_tool", "file", _schema("dict_tool"), lambda args, **ctx: {"name": "café"},
                 isolation=ISOLATION_PROCESS)
    assert reg.dispatch("dict_tool", {}) == '{"name": "café"}'


def test_structured_results_serialize_what_json_cannot(reg: ToolRegistry) -> None:
    """Kills ``default=None`` / left out in tool_result and run_here (a datetime in a result would fail the
    call instead of being written as text)."""
    when = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert json.loads(tool_result(at=when)) == {"at": str(when)}
    reg.register("dated", "file", _schema("dated"), lambda args, **ctx: {"at": when}, isolation=ISOLATION_PROCESS)
    assert json.loads(reg.dispatch("dated", {})) == {"at": str(when)}


@pytest.mark.parametrize("markup", ["<![CDATA[raw]]>", "<note kind='x'>", "```python"])
def test_markup_in_an_error_becomes_one_space(markup: str) -> None:
    """Kills sanitize_error_text's ``_CDATA.sub("XX XX", ...)``, ``_XML_TAG.sub("XX XX", ...)`` and
    ``_FENCE.sub("XX XX", ...)``."""
    assert sanitize_error_text(f"before{markup} after") == "before after"


def test_an_error_is_read_only_up_to_four_times_its_limit() -> None:
    """Kills sanitize_error_text's ``text[: 5 * limit]`` (the cut that bounds the patterns' cost)."""
    assert sanitize_error_text(" " * (4 * MAX_ERROR_CHARS) + "tail") == ""


def test_an_error_of_exactly_the_limit_is_kept_whole_and_a_longer_one_is_cut_to_it() -> None:
    """Kills sanitize_error_text's ``len(text) >= limit`` and ``text[: limit - 2]``."""
    exact = "e" * MAX_ERROR_CHARS
    assert sanitize_error_text(exact) == exact
    cut = sanitize_error_text("e" * (MAX_ERROR_CHARS + 50))
    assert len(cut) == MAX_ERROR_CHARS and cut.endswith("…")


def test_truncation_boundaries() -> None:
    """Kills truncate_result's ``len(text) < limit`` (a result of exactly the limit cut) and ``max(1, ...)``
    (a limit shorter than the marker keeping a character of the result)."""
    assert truncate_result("r" * 100, 100) == "r" * 100
    assert truncate_result("r" * 100, 10) == "\n[... truncated: showing 10 of 100 characters]"


def test_why_a_tool_is_unavailable_is_said_in_words(reg: ToolRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hermes-gateway tools`` shows the operator why a tool is off, naming what to set.

    Kills unavailable_reason's wording mutants: ``"not registered"``, ``"not configured or not reachable"``
    (``"XX..XX"`` or upper case) and ``'XX, XX'.join`` of the missing variables."""
    monkeypatch.delenv("HERMES_TEST_KEY_A", raising=False)
    monkeypatch.delenv("HERMES_TEST_KEY_B", raising=False)
    reg.register("keyed", "web", _schema("keyed"), _here, requires_env=("HERMES_TEST_KEY_A", "HERMES_TEST_KEY_B"))
    reg.register("probed", "web", _schema("probed"), _here, check_fn=lambda: False)
    assert reg.unavailable_reason("nowhere") == "not registered"
    assert reg.unavailable_reason("keyed") == "needs HERMES_TEST_KEY_A, HERMES_TEST_KEY_B"
    assert reg.unavailable_reason("probed") == "not configured or not reachable"
