"""The gateway process: wires config, store, agent, adapters, router, outbox and HTTP together."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import model_tools
from gateway import tokens
from gateway.adapters import build_adapters, receives_on
from gateway.agent import Agent
from gateway.agent_loop import build_client, load_sdk_modules
from gateway.agent_workers import AgentWorkers
from gateway.api import api_routes
from gateway.commands import menu_commands
from gateway.config import Config, ConfigError
from gateway.coordination import Coordinator, LocalCoordinator
from gateway.cron import CronService, StoreCronBackend
from gateway.dashboard import DashboardContext, mount_dashboard
from gateway.delegation import Delegation, install_delegation
from gateway.http import HttpServer
from gateway.logs import redactor
from gateway.media.run_media import vision_describer
from gateway.messaging import install_messaging
from gateway.metrics import Metrics
from gateway.outbox import OutboxSender
from gateway.plugins import PluginParts, check_with_plugins, load_gateway_plugins
from gateway.retention import Pruner, ResultPruner, check_dedupe_window
from gateway.router import Router
from gateway.runs import RunExecutor
from gateway.session_search import install_session_search
from gateway.state_stores import PlatformStateStore
from gateway.status import gateway_summary
from gateway.store import Store
from gateway.tool_sandbox import start_sandbox, stop_sandbox, tool_settings
from gateway.tool_state import install_tool_backends, uninstall_tool_backends
from gateway.watchdog import LoopWatchdog
from platforms.base import AdapterState, BasePlatformAdapter
from tools.cronjob_tools import set_cron_backend
from tools.media_tools import set_describer
from tools.plugins import LoadedPlugins
from tools.registry import registry
from tools.sandbox import SandboxPool
from tools.sandbox.settings import reset_tool_settings
from tools.send_message_tool import set_messaging_backend
from tools.session_search_tool import set_session_search_backend
from toolsets import (
    SOURCE_PREFIXES,
    TOOLSETS,
    remove_source_toolset,
    set_plugin_platform_toolset,
    set_source_toolset,
)

logger = logging.getLogger(__name__)
WORKERS_START_WAIT = 30.0  # seconds start() waits for a first agent worker (runs wait for one anyway)


def _run_ceilings(cfg: Config) -> int:
    """Runs that may be going on at once: every kind's ceiling together (one model call each at most)."""
    return sum(ceiling for _, ceiling in cfg.gateway.run_limits().values())


def _redact_tool_result(name: str, args: dict[str, Any], result: str) -> str:
    """Tool output is stored and shown to the model: keep secrets out of both."""
    return redactor(result)


def install_source_toolsets(cfg: Config, plugins: LoadedPlugins) -> list[str]:
    """Toolsets of the loaded plugins and ``hermes-<platform>`` of their platforms, plus an empty one (logged)
    for each mcp-/plugin- toolset the config names that nothing provides, so those runs still start; returns
    the names created."""
    created: list[str] = []
    for plugin in plugins.statuses:
        if plugin.ok:
            set_source_toolset(plugin.toolset, f"Tools of plugin {plugin.name}.", plugin.tools)
            created.append(plugin.toolset)
    for platform in plugins.platforms.values():
        if set_plugin_platform_toolset(platform.name, f"plugin-{platform.plugin}") is not None:
            created.append(f"hermes-{platform.name}")
    named = {n for names in cfg.toolsets.values() for n in ([names] if isinstance(names, str) else names)}
    for name in sorted(n for n in named if n.startswith(SOURCE_PREFIXES) and n not in TOOLSETS):
        logger.warning("toolset %s is named in the config but no MCP server or plugin provides it", name)
        set_source_toolset(name, "Named in the config; nothing provides it.", ())
        created.append(name)
    return created


class _Mcp(Protocol):
    """What the gateway uses of ``gateway.mcp_service.McpService``."""

    def readiness(self) -> dict[str, dict[str, Any]]: ...

    def reload(self) -> str: ...

    async def stop(self) -> None: ...


class Gateway:
    """One running gateway. ``start()`` then ``stop()``; ``adapters`` may be injected by tests.

    ``local``: a front end's own gateway (``hermes-gateway chat``) beside any daemon on the same store: it runs
    only the injected adapters and their sessions; no configured platforms, HTTP server, cron scheduler, replica
    coordination or resumed work, and its outbox sends only its adapters' parts.
    """

    def __init__(self, cfg: Config, adapters: dict[str, BasePlatformAdapter] | None = None, *,
                 local: bool = False) -> None:
        self.cfg = cfg
        self.local = local
        self.metrics = Metrics()
        self._extra_adapters = adapters or {}
        self.adapters: dict[str, BasePlatformAdapter] = {}
        self.store: Store | None = None
        self.http: HttpServer | None = None
        self.router: Router | None = None
        self.outbox: OutboxSender | None = None
        self.cron: CronService | None = None
        self._tool_pool: ThreadPoolExecutor | None = None
        self._watchdog: LoopWatchdog | None = None
        self._client: Any = None
        self.mcp: _Mcp | None = None
        self.plugins: LoadedPlugins | None = None
        self._plugin_parts = PluginParts()
        self._source_toolsets: list[str] = []
        self._stopped = False
        self._accepting = False  # from serving until draining: what /readyz reports besides the store
        self.started_at = 0.0  # unix time of start()
        self.coordinator: Coordinator = LocalCoordinator() if local else Coordinator.for_store(cfg.store.url)
        self._leadership_changed = asyncio.Event()
        self._leadership_task: asyncio.Task[None] | None = None
        self._cron_running = False
        self.pruner: Pruner | None = None
        self.result_pruner = ResultPruner(cfg.gateway.workspace, cfg.store.retention)
        self.sandbox: SandboxPool | None = None
        self.delegation: Delegation | None = None
        self.workers: AgentWorkers | None = None

    @property
    def port(self) -> int | None:
        """The bound HTTP port."""
        return self.http.port if self.http else None

    async def start(self) -> None:
        """Open the store, connect adapters, resume unfinished work and start serving."""
        cfg = self.cfg
        self.started_at = time.time()
        redactor.add(cfg.secret_values())
        model_tools.register_hook("transform_tool_result", _redact_tool_result)
        check_dedupe_window(cfg)
        registry.discover_builtin_tools()
        self.plugins = load_gateway_plugins(cfg)
        try:
            plugin_platforms = check_with_plugins(cfg, self.plugins, platforms=not self.local)
        except ConfigError:
            self.plugins.unload()
            raise
        for enabled in plugin_platforms.values():
            redactor.add(enabled.secrets)
        self._plugin_parts.install(self.plugins)
        if cfg.gateway.agent_workers and not self.local:  # the console chat keeps its one loop in-process
            # Started first: their start-up (~1 s of imports each) overlaps the gateway's own.
            self.workers = AgentWorkers(cfg.gateway.agent_workers, cfg.model, _run_ceilings(cfg), self.metrics)
            await self.workers.start()
        self.store = await Store.open(cfg.store.url)
        if not self.local:
            self.pruner = Pruner(self.store, cfg.store.retention, cfg.limits)
        self.result_pruner.start()
        coordinator = self.coordinator
        coordinator.on_leadership = lambda _leader: self._leadership_changed.set()
        await coordinator.start()
        tool_settings(cfg).apply()
        # Probes the machine (a short subprocess); the workers then start in the background.
        self.sandbox = await asyncio.to_thread(start_sandbox, cfg)
        await asyncio.to_thread(tokens.warm)  # runs count their history's tokens: no vocabulary load on the loop
        if self.sandbox is not None:
            self.metrics.watch_sandbox(self.sandbox.stats)
        if cfg.mcp_servers:
            # Imported only when configured: the MCP SDK costs ~18 MiB and 1-3 s of start-up.
            from gateway.mcp_service import McpService

            mcp = McpService(cfg.mcp_servers, self.sandbox.program_launcher() if self.sandbox else None)
            mcp.start()  # connects in the background: a slow server never delays startup
            self.mcp = mcp
        self._source_toolsets = install_source_toolsets(cfg, self.plugins)
        install_tool_backends(self.store, asyncio.get_running_loop())
        set_describer(vision_describer(cfg))
        self._client = build_client(cfg.model, max_connections=_run_ceilings(cfg))  # one model call per run at a time
        await load_sdk_modules()
        self._tool_pool = ThreadPoolExecutor(cfg.gateway.tool_threads, thread_name_prefix="hermes-tool")
        agent = Agent(cfg.model, self._client, self._tool_pool, self.metrics,
                      max_turn_result_chars=cfg.tools.max_turn_result_chars)
        agent.workers = self.workers
        self.adapters = {**({} if self.local else build_adapters(cfg, plugin_platforms)), **self._extra_adapters}
        platform_state = PlatformStateStore(self.store)
        for adapter in self.adapters.values():
            adapter.on_rejected = lambda platform, reason: self.metrics.events.labels(platform, reason).inc()
            adapter.state_store = platform_state
        self.outbox = (OutboxSender(self.store, self.adapters, self.metrics, sole_sender=False,
                                    platforms=frozenset(self.adapters)) if self.local else
                       OutboxSender(self.store, self.adapters, self.metrics, coordinator.replica_id,
                                    sole_sender=coordinator.sole, live_senders=coordinator.live_replicas))
        executor = RunExecutor(cfg, self.store, agent, self.adapters, self.outbox, self.metrics)
        self.delegation = install_delegation(cfg, agent, executor.plan_for, asyncio.get_running_loop())
        self.router = Router(cfg, self.store, executor, self.outbox, self.adapters, self.metrics, coordinator)
        coordinator.on_locks_lost = self.router.locks_lost
        coordinator.on_stop_request = self.router.stop_requested
        self.cron = CronService(cfg, self.store, self.router.on_message, self.outbox, self.adapters, self.metrics)
        executor.cron_hook = self.router.cron = self.cron
        self.router.mcp = self.mcp
        set_cron_backend(StoreCronBackend(self.cron, asyncio.get_running_loop()))
        install_session_search(cfg, self.store, asyncio.get_running_loop())
        install_messaging(cfg, self.store, self.adapters, self.outbox, asyncio.get_running_loop())
        if not self.local:
            self.http = HttpServer(cfg.http, self.metrics, self.store, self._readiness, self._summary)
            if cfg.http.api.enabled:
                self.http.add_routes(api_routes(cfg, self.store, self.router, self.cron))
            if cfg.http.dashboard.enabled:
                mount_dashboard(self.http.app, DashboardContext(cfg, self.store, self.router, self.cron,
                                                                self.adapters, self.metrics, coordinator))
            for adapter in self.adapters.values():
                routes = getattr(adapter, "http_routes", None)
                if routes is not None:
                    self.http.add_routes(routes())
            # Unfinished work first, before anything new can be accepted: older events keep their place.
            if self.workers is not None:  # runs resumed or accepted from now on do not wait for a worker to start
                await self.workers.wait_ready(WORKERS_START_WAIT)
            await self.router.resume()
            self._accepting = True
            await self.http.start()
        for name, adapter in self.adapters.items():
            receive = receives_on(cfg, name) == "all" or self.coordinator.is_leader
            try:
                await adapter.connect(self.router.on_message, receive=receive)
                if receive:  # the native command menu (one replica publishes it)
                    await adapter.set_commands(menu_commands(cfg))
            except Exception as exc:  # one broken platform never stops the others
                logger.error("platform %s failed to start: %s", name, exc)
        if not self.local:
            await self._apply_leadership()  # as leader, the scheduler runs before start() returns
            self._leadership_task = asyncio.create_task(self._follow_leadership(), name="leadership")
        self.outbox.start()
        # Everything alive now (modules, clients, config) lives as long as the process: keep it out of the
        # full garbage collections, whose pauses stall the event loop in proportion to what they scan.
        gc.collect()
        gc.freeze()
        # After that collection: start-up's own pause is not a stall worth reporting.
        self._watchdog = LoopWatchdog(self.metrics, cfg.gateway.loop_lag_warn_ms / 1000)
        self._watchdog.start()
        # Run limits follow the loops' lag (this process's and the agent workers') from now on.
        executor.admission.start(self._watchdog.lag_p99, *([self.workers.worst_lag] if self.workers else []))
        logger.info("gateway started: platforms=%s http=%s:%s", ",".join(self.adapters), cfg.http.host, self.port)

    async def _follow_leadership(self) -> None:
        while True:
            await self._leadership_changed.wait()
            await self._apply_leadership()

    async def _apply_leadership(self) -> None:
        """Run what only the leader runs while this replica leads: the cron scheduler, retention, and receiving
        on the platforms whose connection must be single (``run_on: leader``)."""
        self._leadership_changed.clear()
        leader = self.coordinator.is_leader
        self.metrics.leader.set(int(leader))
        try:
            if self.cron is not None and leader != self._cron_running:
                await (self.cron.start() if leader else self.cron.stop())
                self._cron_running = leader
        except Exception:
            logger.exception("cron: following a leadership change failed")
        if self.pruner is not None and leader != self.pruner.running:
            if leader:
                self.pruner.start()
            else:
                await self.pruner.stop()
        for name, adapter in self.adapters.items():
            if (receives_on(self.cfg, name) != "leader" or adapter.receiving == leader
                    or adapter.state == AdapterState.FAILED):  # a failed start was reported once
                continue
            try:
                await (adapter.start_receiving() if leader else adapter.stop_receiving())
            except Exception as exc:  # one broken platform never stops the others
                logger.error("platform %s: %s receiving failed: %s", name, "starting" if leader else "stopping",
                             exc)

    async def _readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready: the store answers and this process serves (started, not draining). Platforms, MCP servers and
        plugins are detail only: one chat platform's outage must not take webhooks and the API out of service."""
        store_ok = self.store is not None and await self.store.ping()
        platforms = {name: a.status() for name, a in self.adapters.items()}
        ready = store_ok and self._accepting
        return ready, {"store": "ok" if store_ok else "unreachable", "draining": self._stopped, "platforms": platforms,
                       "coordination": self.coordinator.status(),
                       "mcp": self.mcp.readiness() if self.mcp else {},
                       "plugins": {p.name: p.to_dict() for p in self.plugins.statuses} if self.plugins else {},
                       "agent_workers": self.workers.status() if self.workers is not None else None}

    async def _summary(self) -> dict[str, Any]:
        assert self.store is not None
        ready, detail = await self._readiness()
        return await gateway_summary(self.store, ready, detail, started_at=self.started_at,
                                     isolation=self.sandbox.isolation if self.sandbox else None)

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop accepting, let running work finish up to the drain timeout, flush the outbox, close.

        A second call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        self._accepting = False
        timeout = self.cfg.gateway.drain_timeout if drain_timeout is None else drain_timeout
        if self._leadership_task is not None:
            self._leadership_task.cancel()
            await asyncio.gather(self._leadership_task, return_exceptions=True)
        if self.cron is not None and self._cron_running:
            await self.cron.stop()
        if self.pruner is not None:
            await self.pruner.stop()
        await self.result_pruner.stop()
        for name, adapter in self.adapters.items():  # hand single connections over to another replica early
            try:
                await adapter.stop_receiving()
            except Exception as exc:
                logger.warning("platform %s did not stop receiving cleanly: %s", name, exc)
        if self.router is not None:
            self.router.closing = True  # new events are refused, so platforms redeliver them later
            await self.router.stop_sweeping()
            if not await self.router.lanes.wait_idle(timeout):
                logger.warning("drain timeout: unfinished runs will resume on the next start")
            await self.router.lanes.shutdown()
            await self.router.limiter.give_back()  # before the store closes: a restart loses no user's tokens
        if self.workers is not None:  # after the runs: none is still asking its worker
            await self.workers.stop()
        if self.mcp is not None:
            await self.mcp.stop()
        if self.outbox is not None:
            await self.outbox.flush(min(5.0, max(0.5, timeout)))
            await self.outbox.stop()
        for name, adapter in self.adapters.items():  # after the flush: answers need the connections
            try:
                await adapter.disconnect()
            except Exception as exc:
                logger.warning("platform %s did not disconnect cleanly: %s", name, exc)
        if self.router is not None:
            await self.router.executor.admission.stop()
        if self._watchdog is not None:
            await self._watchdog.stop()
        if self.http is not None:
            await self.http.stop()
        if self.delegation is not None:  # sub-agents of runs cut short by the drain: before the client closes
            await self.delegation.stop()
        if self._tool_pool is not None:
            self._tool_pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
        await self.coordinator.stop()
        if self.store is not None:
            await self.store.close()
        await asyncio.to_thread(stop_sandbox, self.sandbox)
        reset_tool_settings()  # the tool settings are process-wide: leave them as we found them
        uninstall_tool_backends()
        set_describer(None)
        set_cron_backend(None)
        set_session_search_backend(None)
        set_messaging_backend(None)
        for name in self._source_toolsets:
            remove_source_toolset(name)
        self._plugin_parts.remove()
        if self.plugins is not None:
            self.plugins.unload()
        model_tools.unregister_hook("transform_tool_result", _redact_tool_result)
        logger.info("gateway stopped")
