"""The ``delegate_task`` tool: hand sub-tasks to sub-agents that work on them at the same time and report back.

The tool checks the tasks and hands them to the ``DelegationBackend`` the gateway installs (gateway/delegation.py),
which runs one child agent per task and waits for all of them. Its description and the ``tasks`` parameter's are
rebuilt from the installed limits on every definitions pass (``dynamic_schema_overrides``), so the model reads the
operator's numbers, not the defaults.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from tools.registry import ISOLATION_PROCESS, KNOWN_EFFECTS, BackendSlot, registry, tool_error, tool_result

MAX_GOAL_CHARS = 4_000
MAX_CONTEXT_CHARS = 20_000
MAX_TOOLSETS = 16


@dataclass(frozen=True, slots=True)
class DelegationLimits:
    """What the schema tells the model: tasks per call (all running at once) and how deep delegation nests."""

    max_concurrent_children: int = 3
    max_spawn_depth: int = 1


@dataclass(frozen=True, slots=True)
class SubTask:
    """One task for a sub-agent; ``toolsets`` None: the default (the delegating agent's own)."""

    goal: str
    context: str = ""
    toolsets: tuple[str, ...] | None = None


@dataclass(slots=True)
class ChildReport:
    """How one sub-agent ended: ``status`` "completed", "failed", "cancelled", or why its loop stopped early
    ("max_turns", "budget", ...); ``summary`` is its last answer, ``tool_calls`` the tools it called, in order."""

    goal: str
    status: str
    summary: str = ""
    error: str | None = None
    tool_calls: list[str] = field(default_factory=list)
    model_calls: int = 0


class DelegationError(Exception):
    """A delegation refused as a whole (a toolset the agent lacks, too deep, no run); the message says why."""


class DelegationBackend(Protocol):
    """Runs the sub-agents; called on a tool worker thread."""

    limits: DelegationLimits

    def delegate(self, tasks: Sequence[SubTask], ctx: Mapping[str, Any]) -> list[ChildReport]:
        """One sub-agent per task, concurrently, for the call whose context is ``ctx``; blocks until all have
        ended or the run is stopped. Raises DelegationError."""
        ...


_slot: BackendSlot[DelegationBackend | None] = BackendSlot(None)
# Point the tool at the gateway's sub-agent runner (None: delegation unavailable).
set_delegation_backend = _slot.set
get_delegation_backend = _slot.get



# -- arguments --------------------------------------------------------------

_TASK_FIELDS = ("goal", "context", "toolsets")


def _task(raw: Any, where: str) -> SubTask | str:
    """One task from the model's arguments, or what is wrong with it."""
    if not isinstance(raw, Mapping):
        return f"{where} must be an object with goal (and optionally context, toolsets)."
    unknown = sorted(set(raw) - set(_TASK_FIELDS))
    if unknown:
        return f"{where} has unknown fields {', '.join(unknown)}; a task has goal, context and toolsets."
    goal, context, toolsets = raw.get("goal"), raw.get("context") or "", raw.get("toolsets")
    if not isinstance(goal, str) or not goal.strip():
        return f"{where} needs a goal: a non-empty string saying what the sub-agent should accomplish."
    if len(goal) > MAX_GOAL_CHARS:
        return f"{where}: the goal has {len(goal)} characters; the limit is {MAX_GOAL_CHARS} (move detail to context)."
    if not isinstance(context, str):
        return f"{where}: context must be a string."
    if len(context) > MAX_CONTEXT_CHARS:
        return f"{where}: the context has {len(context)} characters; the limit is {MAX_CONTEXT_CHARS}."
    if toolsets is not None and (not isinstance(toolsets, list) or len(toolsets) > MAX_TOOLSETS
                                 or not all(isinstance(t, str) and t for t in toolsets)):
        return f"{where}: toolsets must be a list of at most {MAX_TOOLSETS} toolset names."
    return SubTask(goal.strip(), context.strip(), tuple(toolsets) if toolsets else None)


def _parse_tasks(args: Mapping[str, Any], limits: DelegationLimits) -> list[SubTask] | str:
    """The tasks of a call (``tasks``, or one ``goal`` with its context and toolsets), or what is wrong."""
    tasks = args.get("tasks")
    if tasks is None:
        if args.get("goal") is None:
            return "Give goal (one task) or tasks (a list of {goal, context, toolsets})."
        one = _task({k: args[k] for k in _TASK_FIELDS if k in args}, "the task")
        return one if isinstance(one, str) else [one]
    if any(args.get(k) is not None for k in _TASK_FIELDS):
        return "Give either tasks or goal, not both: with tasks, goal, context and toolsets go inside each task."
    if not isinstance(tasks, list) or not tasks:
        return "tasks must be a non-empty list of {goal, context, toolsets} objects."
    if len(tasks) > limits.max_concurrent_children:
        return (f"{len(tasks)} tasks given; at most {limits.max_concurrent_children} per call "
                "(delegation.max_concurrent_children). Hand out the rest in a later call.")
    parsed: list[SubTask] = []
    for i, raw in enumerate(tasks):
        one = _task(raw, f"tasks[{i}]")
        if isinstance(one, str):
            return one
        parsed.append(one)
    return parsed


def _delegate(args: dict[str, Any], **ctx: Any) -> str:
    backend = _slot.get()
    if backend is None:
        return tool_error("delegate_task is unavailable: it runs only inside the gateway, which runs the sub-agents.")
    tasks = _parse_tasks(args, backend.limits)
    if isinstance(tasks, str):
        return tool_error(tasks)
    try:
        reports = backend.delegate(tasks, ctx)
    except DelegationError as exc:
        return tool_error(str(exc))
    return tool_result(results=[asdict(r) for r in reports], total=len(reports),
                       completed=sum(r.status == "completed" for r in reports),
                       note="Summaries are the sub-agents' own reports: check a claimed side effect before "
                            "telling the user it happened.")


# -- schema -----------------------------------------------------------------

def _describe(limits: DelegationLimits) -> str:
    """The tool's description for these limits."""
    n, depth = limits.max_concurrent_children, limits.max_spawn_depth
    nesting = ("Sub-agents cannot delegate further (delegation.max_spawn_depth is 1)." if depth == 1 else
               f"Sub-agents may delegate in turn, nested up to depth {depth} (delegation.max_spawn_depth); "
               "those at that depth cannot.")
    return (
        "Hand sub-tasks to sub-agents that work on them at the same time, each in a fresh conversation with its "
        "own tools (never more than yours), and get back one result per task: its status and summary. "
        f"Up to {n} tasks run concurrently (delegation.max_concurrent_children). {nesting} "
        "Use it for independent pieces of work (research A and B at once) or work whose intermediate output "
        "would flood this conversation; not for a single tool call. "
        "Sub-agents know nothing of this conversation: put everything they need in goal and context, including "
        "the language to answer in. They cannot ask the user anything, and any call of theirs that would need "
        "the user's approval is refused. /stop stops them with you."
    )


def _describe_tasks(limits: DelegationLimits) -> str:
    """The ``tasks`` parameter's description for these limits."""
    return (f"The tasks, one sub-agent each: up to {limits.max_concurrent_children} per call, all running "
            "concurrently (delegation.max_concurrent_children). For one task give goal instead.")


_TASK_PROPERTIES: dict[str, Any] = {
    "goal": {"type": "string", "description": "What the sub-agent should accomplish: specific and self-contained."},
    "context": {"type": "string",
                "description": "What it needs to know: file paths, error messages, constraints, the user's "
                               "language. It has no other view of this conversation."},
    "toolsets": {"type": "array", "items": {"type": "string"},
                 "description": "Toolsets it may use, e.g. [\"web\"] or [\"file\"]; default: yours. It gets only "
                                "tools you have."},
}

SCHEMA: dict[str, Any] = {
    "name": "delegate_task",
    "description": _describe(DelegationLimits()),  # rebuilt from the installed limits on every definitions pass
    "parameters": {
        "type": "object",
        "properties": {
            **_TASK_PROPERTIES,
            "tasks": {"type": "array", "description": _describe_tasks(DelegationLimits()),
                      "items": {"type": "object", "properties": _TASK_PROPERTIES, "required": ["goal"]}},
        },
        "required": [],
    },
}


def _schema_overrides() -> dict[str, Any]:
    limits = backend.limits if (backend := _slot.get()) is not None else DelegationLimits()
    parameters = copy.deepcopy(SCHEMA["parameters"])
    parameters["properties"]["tasks"]["description"] = _describe_tasks(limits)
    return {"description": _describe(limits), "parameters": parameters}


registry.register(
    name="delegate_task",
    toolset="delegation",
    schema=SCHEMA,
    handler=_delegate,
    description="Hand sub-tasks to sub-agents working at the same time; one status and summary per task.",
    emoji="🔀",
    dynamic_schema_overrides=_schema_overrides,
    # Its sub-agents can do whatever their tools do: every effect, so restricted toolsets and approval modes
    # that look at effects treat it as the most capable of them.
    effects=KNOWN_EFFECTS,
    isolation=ISOLATION_PROCESS,  # it drives the gateway's own agent loop
)
