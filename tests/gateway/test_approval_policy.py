"""The approval policy and gate (gateway/approvals.py) case by case: which calls run, which ask and which are refused,
by mode, toolset, declared effects, run kind, standing approvals (stored and configured), and the config errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.approvals import APPROVED, ApprovalGate, ApprovalPolicy, decide, insert_approval, new_approval
from gateway.config import ConfigError, parse_config
from gateway.store import Store
from tools.registry import registry

WORKSPACE = "/srv/ws"


@pytest.fixture(autouse=True)
def _tools() -> None:
    registry.discover_builtin_tools()


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    """The store on SQLite and on PostgreSQL (grants are written with a conflict-ignoring insert per dialect)."""
    s = await Store.open(store_url)
    yield s
    await s.close()


def _cfg(tmp_path: Path, approvals: dict[str, Any] | None = None, route: dict[str, Any] | None = None) -> Any:
    return parse_config({"approvals": approvals or {}, "platforms": {"webhook": {"routes": {"ci": {
        "secret": "s3cret-s3cret", "prompt": "p", **(route or {})}}}}},
        env={"HERMES_GATEWAY_HOME": str(tmp_path)})


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def _verdicts(store: Store, cfg: Any, calls: list[dict[str, Any]], *, kind: str = "chat",
                    source: str = "telegram", toolsets: tuple[str, ...] = ("hermes-telegram",),
                    user: str | None = "telegram:1") -> list[tuple[str, list[str]]]:
    gate = ApprovalGate(ApprovalPolicy(cfg), store, kind=kind, source=source, toolsets=toolsets, user_key=user,
                        session_key="telegram:dm:1", workspace=WORKSPACE)
    return [(v.action, [d.pattern for d in v.dangers]) for v in await gate.check(calls)]


RM = _call("terminal", command="rm -rf build/")
LS = _call("terminal", command="ls -la")
TODO = _call("todo", todos=[])


async def test_modes(store: Store, tmp_path: Path) -> None:
    dangerous = _cfg(tmp_path)
    assert await _verdicts(store, dangerous, [RM, LS, TODO]) == [
        ("ask", ["terminal:destructive-delete"]), ("run", []), ("run", [])]
    never = _cfg(tmp_path, {"mode": "never"})
    assert [a for a, _ in await _verdicts(store, never, [RM, LS, TODO])] == ["run", "run", "run"]
    always = _cfg(tmp_path, {"mode": "always"})
    assert await _verdicts(store, always, [RM, LS, TODO]) == [
        ("ask", ["terminal:destructive-delete"]), ("ask", ["terminal:runs_commands"]), ("ask", ["todo:writes_state"])]
    per_toolset = _cfg(tmp_path, {"mode": "never", "toolsets": {"hermes-telegram": "dangerous"}})
    assert [a for a, _ in await _verdicts(store, per_toolset, [RM])] == ["ask"]
    assert [a for a, _ in await _verdicts(store, per_toolset, [RM], toolsets=("hermes-discord",))] == ["run"]


async def test_declared_effects_and_network(store: Store, tmp_path: Path) -> None:
    effects = _cfg(tmp_path, {"ask_for_effects": ["writes_state"]})
    assert await _verdicts(store, effects, [TODO]) == [("ask", ["todo:writes_state"])]
    curl = _call("terminal", command="curl -s https://example.com")
    assert [a for a, _ in await _verdicts(store, _cfg(tmp_path), [curl])] == ["run"]
    assert await _verdicts(store, _cfg(tmp_path, {"network": True}), [curl]) == [("ask", ["terminal:network"])]


async def test_a_tool_running_code_the_classifier_cannot_read_asks(store: Store, tmp_path: Path) -> None:
    """execute_code runs a script (and the tools it calls) that the terminal classifier never sees: before this
    rule, a script calling terminal("rm -rf ...") ran in mode dangerous without anyone being asked."""
    script = _call("execute_code", code="from hermes_tools import terminal\nterminal(command='rm -rf build/')")
    assert await _verdicts(store, _cfg(tmp_path), [script]) == [("ask", ["execute_code:runs_commands"])]
    assert [a for a, _ in await _verdicts(store, _cfg(tmp_path, {"mode": "never"}), [script])] == ["run"]
    assert [a for a, _ in await _verdicts(store, _cfg(tmp_path), [script], kind="cron", source="j")] == ["deny"]
    allowed = _cfg(tmp_path, {"cron_allow": ["execute_code:*"], "trusted": {"telegram:1": ["execute_code:*"]}})
    assert [a for a, _ in await _verdicts(store, allowed, [script], kind="cron", source="j")] == ["run"]
    assert [a for a, _ in await _verdicts(store, allowed, [script])] == ["run"]


async def test_runs_nobody_can_ask_refuse_unless_allowed(store: Store, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {"cron_allow": ["terminal:destructive-delete"]}, {"approvals_allow": ["terminal:*"]})
    plain = _cfg(tmp_path)
    for kind, source in (("webhook", "ci"), ("cron", "job1"), ("background", "abc123"), ("api", "api")):
        [(action, patterns)] = await _verdicts(store, plain, [RM], kind=kind, source=source)
        assert (action, patterns) == ("deny", ["terminal:destructive-delete"]), kind
    assert [a for a, _ in await _verdicts(store, cfg, [RM], kind="webhook", source="ci")] == ["run"]
    assert [a for a, _ in await _verdicts(store, cfg, [RM], kind="cron", source="job1")] == ["run"]
    assert [a for a, _ in await _verdicts(store, cfg, [RM], kind="background", source="abc123")] == ["deny"]
    never_route = _cfg(tmp_path, route={"approvals": "never"})
    assert [a for a, _ in await _verdicts(store, never_route, [RM], kind="webhook", source="ci")] == ["run"]


async def test_standing_approvals(store: Store, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {"trusted": {"telegram:7": ["terminal:destructive-delete"]}})
    assert [a for a, _ in await _verdicts(store, cfg, [RM], user="telegram:7")] == ["run"]
    origin = {"platform": "telegram", "chat_id": "1", "chat_type": "dm", "user_id": "1", "user_name": "a"}
    calls = [{"id": "c1", "name": "terminal", "arguments": "{}", "patterns": ["terminal:destructive-delete"],
              "reasons": ["x"]}]
    session = new_approval("telegram:dm:1", "r1", origin, "telegram:1", calls, 60)
    other_session = new_approval("telegram:dm:9", "r2", origin, "telegram:2", calls, 60)

    def answer(conn: Any) -> None:
        for approval in (session, other_session):
            insert_approval(conn, approval)
        assert decide(conn, session, APPROVED, "a", "session")
        assert decide(conn, other_session, APPROVED, "b", "session")
        assert not decide(conn, session, APPROVED, "a", "always"), "answered twice"

    await store.db.write(answer)
    assert [a for a, _ in await _verdicts(store, cfg, [RM])] == ["run"]  # this session
    assert [a for a, _ in await _verdicts(store, cfg, [RM], user="telegram:2")] == ["ask"]  # another session's


@pytest.mark.parametrize(("approvals", "path", "needle"), [
    ({"mode": "sometimes"}, "approvals.mode", "never"),
    ({"trusted": {"telegram:1": ["terminal:delete"]}}, "approvals.trusted.telegram:1", "terminal:"),
    ({"cron_allow": ["rm -rf"]}, "approvals.cron_allow", "<tool>:<pattern>"),
    ({"ask_for_effects": ["writes_file"]}, "approvals.ask_for_effects", "writes_files"),
    ({"toolsets": {"hermes-nope": "always"}}, "approvals.toolsets", "hermes-nope"),
])
def test_config_errors_name_the_key_and_the_fix(tmp_path: Path, approvals: dict[str, Any], path: str,
                                                needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, approvals)
    assert path in str(err.value) and needle in str(err.value), str(err.value)
