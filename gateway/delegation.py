"""Sub-agents for ``delegate_task``: the gateway side of tools/delegate_tool.py.

The tool's handler runs on a tool thread and calls ``Delegation.delegate``, which runs one child agent per task as
tasks on the gateway loop and waits for them, watching the run's cancel event (``/stop``) meanwhile. A child is the
gateway's own agent loop on a fresh conversation (``SUBAGENT_PROMPT``, then its goal and context), with:

- tools: its task's toolsets (else ``delegation.default_toolsets``, else its parent's) cut down to what its parent
  may call, never ``CHILD_BLOCKED``, and ``delegate_task`` only while its depth is below
  ``delegation.max_spawn_depth``;
- the run's ``run_id`` in its tool context (so the run's progress message shows its calls), the run's cancel event,
  model, budget and usage (its model calls and tool calls count against the run's limits);
- the run's approval gate, except that a call which would ask the user is refused (``SubAgentGate``).

Concurrency: a call hands out at most ``max_concurrent_children`` tasks, and the children of one run at one nesting
level share that many slots (parallel ``delegate_task`` calls of one turn queue for them). Per run and level rather
than gateway-wide: children waiting for grandchildren would otherwise hold the very slots those need, and runs are
already bounded by ``gateway.max_concurrent_runs``. Children's tool calls run on a thread pool per nesting level for
the same reason: a ``delegate_task`` call holds its thread while its children work.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import model_tools
from gateway.agent import Agent
from gateway.approvals import ApprovalGate, Verdict
from gateway.config import Config
from gateway.limits import RunBudget
from gateway.model_errors import ModelError
from gateway.store import RunUsage
from tools.delegate_tool import (
    ChildReport,
    DelegationError,
    DelegationLimits,
    SubTask,
    get_delegation_backend,
    set_delegation_backend,
)
from toolsets import validate_toolset

logger = logging.getLogger(__name__)

SUBAGENT_PROMPT = (
    "You are a sub-agent: another agent of a chat assistant handed you one task. Nobody reads your messages but "
    "that agent, and it sees only your final answer, so you cannot ask anyone anything. Do the task with your tools, "
    "then answer with a concise summary: what you did, what you found, the files you changed, and anything that "
    "failed or was refused (calls that would need the user's approval are refused for you)."
)
CHILD_BLOCKED = frozenset({
    "clarify",  # nobody can answer a sub-agent's question
    "send_file",  # a file goes with the run's answer, which only the delegating agent writes
})
_CANCEL_POLL = 0.1  # seconds between looks at the run's cancel event while its sub-agents work
_PER_CALL = ("cancel_event", "enabled_tools")  # what the agent and the tool pipeline add to each call's context


@dataclass(frozen=True, slots=True)
class DelegationScope:
    """What an agent passes on to its sub-agents (``tool_ctx["delegation"]``): its toolsets and the tools it may call,
    its depth (0: the run itself), and the run's model, approval gate, budget and usage."""

    toolsets: tuple[str, ...]
    allowed: frozenset[str]
    model: str
    gate: ApprovalGate
    budget: RunBudget | None = None
    usage: RunUsage | None = None
    depth: int = 0


class SubAgentGate(ApprovalGate):
    """The run's approval gate for its sub-agents: standing approvals and denials hold as for the run, and a call
    that would ask the user is refused (nobody can answer a sub-agent mid-task, and the run must not pause on it)."""

    def __init__(self, run_gate: ApprovalGate) -> None:
        super().__init__(run_gate.policy, run_gate.store, kind=run_gate.kind, source=run_gate.source, toolsets=(),
                         user_key=run_gate.user_key, session_key=run_gate.session_key, workspace=run_gate.workspace)
        self.mode = run_gate.mode  # the run's mode (from its toolsets), never one of a sub-agent's narrower toolsets

    async def check(self, calls: Sequence[dict[str, Any]]) -> list[Verdict]:
        """A verdict per call, "ask" turned into "deny"."""
        return [self._refused(v) if v.action == "ask" else v for v in await super().check(calls)]

    @staticmethod
    def _refused(verdict: Verdict) -> Verdict:
        why = "; ".join(d.reason for d in verdict.dangers)
        return Verdict("deny", verdict.dangers,
                       f"Not run: a sub-agent cannot ask the user to approve this ({why}). Say in your summary what "
                       "you needed to run; the agent that delegated to you can run it, asking the user.")


class _Slots:
    """One semaphore of ``size`` per key (a run and a nesting level), dropped when nobody holds or waits for it.
    Used on the event loop only."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held: dict[tuple[str, int], tuple[asyncio.Semaphore, int]] = {}

    @contextlib.asynccontextmanager
    async def take(self, key: tuple[str, int]) -> AsyncIterator[None]:
        semaphore, users = self._held.get(key, (asyncio.Semaphore(self.size), 0))
        self._held[key] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._held[key]
            if users == 1:
                del self._held[key]
            else:
                self._held[key] = (semaphore, users - 1)


PlanFor = Callable[[list[str]], model_tools.ToolPlan]
"""The tool plan of toolsets, as the gateway builds runs' (``RunExecutor.plan_for``)."""


class Delegation:
    """The gateway's ``DelegationBackend``: runs sub-agents on ``loop`` with the run's ``agent``, building their tool
    plans with ``plan_for``."""

    def __init__(self, cfg: Config, agent: Agent, plan_for: PlanFor, loop: asyncio.AbstractEventLoop) -> None:
        settings = self.settings = cfg.delegation
        self.limits = DelegationLimits(settings.max_concurrent_children, settings.max_spawn_depth)
        self.plan_for = plan_for
        self.loop = loop
        model = (cfg.model.model_copy(update={"max_turns": settings.max_turns}) if settings.max_turns is not None
                 else cfg.model)
        self._pools = [ThreadPoolExecutor(cfg.gateway.tool_threads, thread_name_prefix=f"hermes-subagent{depth}")
                       for depth in range(1, settings.max_spawn_depth + 1)]
        self._agents: list[Agent] = []  # the agent of each nesting level, from 1
        for pool in self._pools:
            # The run's agent (its client, metrics and every setting) on its own threads, with max_turns for
            # sub-agents.
            child = copy.copy(agent)
            child.cfg, child.tool_pool = model, pool
            self._agents.append(child)
        self._slots = _Slots(settings.max_concurrent_children)
        self._running: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    # -- on a tool thread ---------------------------------------------------------------------------------------

    def delegate(self, tasks: Sequence[SubTask], ctx: Mapping[str, Any]) -> list[ChildReport]:
        """Run a sub-agent per task for the call whose tool context is ``ctx``; blocks until all have ended (or the
        run is stopped: DelegationError)."""
        scope = ctx.get("delegation")
        if not isinstance(scope, DelegationScope):
            raise DelegationError("delegate_task works only inside a gateway run.")
        if scope.depth >= self.limits.max_spawn_depth:
            raise DelegationError(f"A sub-agent at depth {scope.depth} cannot delegate "
                                  f"(delegation.max_spawn_depth is {self.limits.max_spawn_depth}).")
        plans = [self._plan(task, scope, f"tasks[{i}]") for i, task in enumerate(tasks)]  # all checked before any runs
        cancel: threading.Event | None = ctx.get("cancel_event")
        child_ctx = {k: v for k, v in ctx.items() if k not in _PER_CALL}  # the child's calls get their own
        future = asyncio.run_coroutine_threadsafe(self._children(tasks, plans, child_ctx, scope, cancel), self.loop)
        return _wait(future, cancel)

    def _toolsets(self, task: SubTask, scope: DelegationScope) -> tuple[str, ...]:
        """A child's toolsets: its task's, else the configured default, else its parent's."""
        return task.toolsets or tuple(self.settings.default_toolsets) or scope.toolsets

    def _plan(self, task: SubTask, scope: DelegationScope, where: str) -> model_tools.ToolPlan:
        """A child's tools: its toolsets' cut down to its parent's, without the blocked ones."""
        toolsets = self._toolsets(task, scope)
        unknown = [name for name in toolsets if not validate_toolset(name)]
        if unknown:
            raise DelegationError(f"{where}: unknown toolset {unknown[0]!r}. Name toolsets among yours "
                                  f"({', '.join(scope.toolsets)}) or leave toolsets out to give it your tools.")
        plan = self.plan_for(list(toolsets))
        allowed = (plan.allowed & scope.allowed) - CHILD_BLOCKED
        if scope.depth + 1 >= self.limits.max_spawn_depth:
            allowed -= {"delegate_task"}
        if task.toolsets and not allowed:
            raise DelegationError(f"{where}: the toolsets {', '.join(task.toolsets)} hold none of the tools you "
                                  "may use; name others or leave toolsets out.")
        deferred = tuple(name for name in plan.deferred if name in allowed)
        shown = allowed | (set(model_tools.BRIDGE_TOOLS) if deferred else set())
        return dataclasses.replace(plan, definitions=[d for d in plan.definitions if d["function"]["name"] in shown],
                                   allowed=frozenset(allowed), deferred=deferred)

    # -- on the loop --------------------------------------------------------------------------------------------

    async def _children(self, tasks: Sequence[SubTask], plans: Sequence[model_tools.ToolPlan], ctx: dict[str, Any],
                        scope: DelegationScope, cancel: threading.Event | None) -> list[ChildReport]:
        me = asyncio.current_task()
        assert me is not None
        self._running.add(me)
        self._idle.clear()
        try:
            key = (str(ctx.get("run_id") or ""), scope.depth + 1)
            gate = scope.gate if isinstance(scope.gate, SubAgentGate) else SubAgentGate(scope.gate)

            async def child(task: SubTask, plan: model_tools.ToolPlan) -> ChildReport:
                async with self._slots.take(key):
                    return await self._child(task, plan, ctx, scope, gate, cancel)

            return list(await asyncio.gather(*(child(t, p) for t, p in zip(tasks, plans, strict=True))))
        finally:
            self._running.discard(me)
            if not self._running:
                self._idle.set()

    async def _child(self, task: SubTask, plan: model_tools.ToolPlan, ctx: dict[str, Any], scope: DelegationScope,
                     gate: SubAgentGate, cancel: threading.Event | None) -> ChildReport:
        depth = scope.depth + 1
        own = dataclasses.replace(scope, toolsets=self._toolsets(task, scope), allowed=plan.allowed, gate=gate,
                                  depth=depth)
        brief = f"Your task:\n{task.goal}" + (f"\n\nContext:\n{task.context}" if task.context else "")
        messages = [{"role": "system", "content": SUBAGENT_PROMPT}, {"role": "user", "content": brief}]
        try:
            outcome = await self._agents[depth - 1].run(messages, plan, {**ctx, "delegation": own}, cancel=cancel,
                                                        budget=scope.budget, model=scope.model, usage=scope.usage,
                                                        gate=gate)
        except ModelError as exc:
            logger.info("sub-agent of run %s: model error: %s", ctx.get("run_id"), exc)
            return ChildReport(task.goal, "failed", error=exc.user_message)
        except Exception as exc:  # a gateway bug: the other sub-agents and the run go on
            logger.exception("sub-agent of run %s failed unexpectedly", ctx.get("run_id"))
            return ChildReport(task.goal, "failed", error=f"the gateway failed running it ({type(exc).__name__})")
        return ChildReport(task.goal, "completed" if outcome.ended_by == "answer" else outcome.ended_by, outcome.text,
                           tool_calls=[record["name"] for record in outcome.tool_calls],
                           model_calls=outcome.model_calls)

    @property
    def running(self) -> int:
        """Delegations (``delegate_task`` calls) whose sub-agents are working now."""
        return len(self._running)

    async def wait_idle(self) -> None:
        """Return once no sub-agent is working."""
        await self._idle.wait()

    async def stop(self) -> None:
        """Cancel the sub-agents still working (the gateway is stopping), release the threads, and take the tool's
        backend back if it is this one."""
        for task in list(self._running):
            task.cancel()
        await self.wait_idle()
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
        if get_delegation_backend() is self:
            set_delegation_backend(None)
            model_tools.clear_definition_cache()  # the descriptions go back to the default limits


def _wait(future: Future[list[ChildReport]], cancel: threading.Event | None) -> list[ChildReport]:
    """The sub-agents' reports; when ``cancel`` is set first (``/stop``), they are cancelled and DelegationError
    says so."""
    while True:
        try:
            return future.result(None if cancel is None else _CANCEL_POLL)
        except TimeoutError:
            if cancel is not None and cancel.is_set():
                future.cancel()
                raise DelegationError("Stopped: the run was stopped, and its sub-agents with it.") from None
        except CancelledError:
            raise DelegationError("Stopped: the gateway is shutting down; the sub-agents were cancelled.") from None


def install_delegation(cfg: Config, agent: Agent, plan_for: PlanFor, loop: asyncio.AbstractEventLoop) -> Delegation:
    """Make ``delegate_task`` run its sub-agents in this gateway, with ``cfg.delegation``'s limits."""
    delegation = Delegation(cfg, agent, plan_for, loop)
    set_delegation_backend(delegation)
    # The tool's description comes from the limits (dynamic_schema_overrides), which the definition cache does not
    # key on: plans cached under other limits must go.
    model_tools.clear_definition_cache()
    return delegation
