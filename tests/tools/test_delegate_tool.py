"""delegate_tool: the arguments it accepts and refuses, what it hands the backend, and its schema following the
installed limits (the sub-agents themselves run in the gateway: tests/gateway/test_delegation.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import model_tools
from tools.delegate_tool import (
    MAX_GOAL_CHARS,
    ChildReport,
    DelegationError,
    DelegationLimits,
    SubTask,
    get_delegation_backend,
    set_delegation_backend,
)
from tools.registry import ISOLATION_PROCESS, KNOWN_EFFECTS, registry


@dataclass
class Recorder:
    """A backend answering each task with a completed report, keeping what it was given."""

    limits: DelegationLimits = field(default_factory=DelegationLimits)
    calls: list[tuple[list[SubTask], dict[str, Any]]] = field(default_factory=list)
    refuse: str | None = None

    def delegate(self, tasks: Sequence[SubTask], ctx: Mapping[str, Any]) -> list[ChildReport]:
        if self.refuse is not None:
            raise DelegationError(self.refuse)
        self.calls.append((list(tasks), dict(ctx)))
        return [ChildReport(t.goal, "completed", f"did {t.goal}", tool_calls=["todo"], model_calls=2) for t in tasks]


@pytest.fixture
def backend() -> Iterator[Recorder]:
    previous = get_delegation_backend()
    recorder = Recorder()
    set_delegation_backend(recorder)
    yield recorder
    set_delegation_backend(previous)


def call(args: dict[str, Any], **ctx: Any) -> dict[str, Any]:
    return json.loads(registry.dispatch("delegate_task", args, **ctx))


def test_registered_in_the_gateway_with_every_effect() -> None:
    entry = registry.get("delegate_task")
    assert entry is not None
    assert entry.toolset == "delegation" and entry.emoji == "🔀" and entry.isolation == ISOLATION_PROCESS
    assert entry.effects == KNOWN_EFFECTS  # it can do whatever its sub-agents' tools do


def test_one_goal_or_a_list_of_tasks_reach_the_backend_with_the_call_context(backend: Recorder) -> None:
    result = call({"goal": " find the bug ", "context": "in parser.py", "toolsets": ["file"]}, run_id="r1")
    assert backend.calls[0] == ([SubTask("find the bug", "in parser.py", ("file",))], {"run_id": "r1"})
    assert result["results"] == [{"goal": "find the bug", "status": "completed", "summary": "did find the bug",
                                  "error": None, "tool_calls": ["todo"], "model_calls": 2}]
    assert (result["total"], result["completed"]) == (1, 1) and "own reports" in result["note"]

    call({"tasks": [{"goal": "a"}, {"goal": "b", "context": "c"}]})
    assert backend.calls[1][0] == [SubTask("a"), SubTask("b", "c")]


@pytest.mark.parametrize(("args", "error"), [
    ({}, "Give goal (one task) or tasks"),
    ({"goal": "a", "tasks": [{"goal": "b"}]}, "Give either tasks or goal, not both"),
    ({"tasks": [{"goal": "b"}], "context": "x"}, "Give either tasks or goal, not both"),
    ({"tasks": []}, "tasks must be a non-empty list"),
    ({"tasks": [{"goal": "a"}] * 4}, "4 tasks given; at most 3 per call (delegation.max_concurrent_children)"),
    ({"tasks": ["just a string"]}, "tasks[0] must be an object with goal"),
    ({"tasks": [{"goal": "a"}, {"goal": "  "}]}, "tasks[1] needs a goal"),
    ({"tasks": [{"goal": "a", "model": "x"}]}, "tasks[0] has unknown fields model"),
    ({"goal": "a" * (MAX_GOAL_CHARS + 1)}, f"the limit is {MAX_GOAL_CHARS}"),
    ({"goal": "a", "context": 5}, "context must be a string"),
    ({"goal": "a", "toolsets": [""]}, "toolsets must be a list of at most"),
])
def test_bad_arguments_are_refused_with_what_to_fix(backend: Recorder, args: dict[str, Any], error: str) -> None:
    assert error in call(args)["error"]
    assert backend.calls == []


def test_a_json_string_of_tasks_is_coerced_by_the_pipeline(backend: Recorder) -> None:
    result = json.loads(model_tools.handle_function_call("delegate_task", {"tasks": '[{"goal": "a"}]'}))
    assert result["completed"] == 1 and backend.calls[0][0] == [SubTask("a")]


def test_a_refused_delegation_is_a_tool_error(backend: Recorder) -> None:
    backend.refuse = "tasks[0]: unknown toolset 'nope'"
    assert call({"goal": "a"}) == {"error": "tasks[0]: unknown toolset 'nope'"}


def test_without_the_gateway_it_says_so() -> None:
    previous = get_delegation_backend()
    set_delegation_backend(None)
    try:
        assert "runs only inside the gateway" in call({"goal": "a"})["error"]
    finally:
        set_delegation_backend(previous)


def _definition() -> dict[str, Any]:
    (definition,) = registry.get_definitions(["delegate_task"])
    return definition["function"]


def test_description_and_tasks_parameter_follow_the_installed_limits(backend: Recorder) -> None:
    before = _definition()
    assert "Up to 3 tasks run concurrently" in before["description"]
    assert "cannot delegate further (delegation.max_spawn_depth is 1)" in before["description"]
    assert "up to 3 per call" in before["parameters"]["properties"]["tasks"]["description"]

    backend.limits = DelegationLimits(max_concurrent_children=5, max_spawn_depth=2)
    after = _definition()
    assert "Up to 5 tasks run concurrently" in after["description"]
    assert "nested up to depth 2 (delegation.max_spawn_depth)" in after["description"]
    assert "up to 5 per call" in after["parameters"]["properties"]["tasks"]["description"]
    assert after["parameters"]["properties"]["tasks"]["items"]["required"] == ["goal"]
    assert len(call({"tasks": [{"goal": str(i)} for i in range(5)]})["results"]) == 5  # and the limit is applied
