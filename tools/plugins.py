"""Python plugins: installed entry points and the plugins of a plugins directory.

A plugin is
- an entry point in group ``hermes_gateway.tools`` naming a callable (called as ``register(ctx)``)
  or a module, or
- a ``<name>.py`` file or a ``<name>/`` package (with ``__init__.py``) in the plugins directory.

A module registers at import (``registry.register(...)``) or defines ``register(ctx)``. ``ctx`` is a
:class:`PluginContext`: ``register_tool`` (the registry's ``register``), ``register_platform``,
``register_command`` and ``register_hook``. It also answers as the registry itself, so plugins written
as ``register(registry)`` keep working unchanged.

Its tools register under toolset ``plugin-<name>``, the name being the entry point's, the file's stem
or the package's. Replacing a tool registered before it (a built-in) takes ``override=True`` (else the
registry rejects and logs it) and the tool's name in ``allow_override`` (the operator's
``plugins.allow_override``; else the plugin fails). Loading one plugin is all-or-nothing: if it raises
or breaks a rule, whatever it had registered (tools, platforms, commands, hooks) is rolled back, the
error is logged and reported in its status, and the other plugins load as usual.
``LoadedPlugins.unload`` restores the registry as it was.

Platforms, commands and hooks are only recorded here; the gateway installs them (``gateway/plugins.py``).
Loading compares registry snapshots, so load plugins before anything else registers concurrently
(the gateway loads them before it starts its MCP connections).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from tools.registry import Handler, ToolEntry, ToolRegistry, registry, sanitize_error_text

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hermes_gateway.tools"
HOOK_KINDS = ("pre_llm_call", "pre_tool_call", "post_tool_call", "transform_tool_result")
_PLUGIN_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PLATFORM_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_COMMAND_NAME = re.compile(r"[a-z0-9_]{1,32}")  # what every platform's command menu accepts
_MODULE_PREFIX = "hermes_gateway_plugin_"


class PluginError(Exception):
    """A plugin broke a registration rule; it is not loaded."""


@dataclass(frozen=True, slots=True)
class PluginPlatform:
    """A chat platform a plugin provides: ``adapter_factory(settings)`` returns a ``BasePlatformAdapter``
    named ``name``, ``settings`` being the ``platforms.<name>`` config section validated by ``config_model``."""

    name: str
    plugin: str
    adapter_factory: Callable[[Any], Any]
    config_model: type[BaseModel]


@dataclass(frozen=True, slots=True)
class PluginCommand:
    """A chat command a plugin provides: ``/name``, its help line, and its handler (given the gateway's
    ``CommandContext``; returns the reply text, or an awaitable of it)."""

    name: str
    plugin: str
    description: str
    handler: Callable[..., Any]
    admin_only: bool = False


@dataclass(frozen=True, slots=True)
class PluginHook:
    """A hook a plugin adds to the tool pipeline or the model call (``model_tools.register_hook``)."""

    kind: str
    plugin: str
    fn: Callable[..., Any]


@dataclass(frozen=True, slots=True)
class PluginStatus:
    """One plugin: where it came from and what it registered, or why it failed."""

    name: str
    source: str
    tools: tuple[str, ...] = ()
    error: str | None = None
    platforms: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()

    @property
    def toolset(self) -> str:
        """The toolset its tools belong to."""
        return f"plugin-{self.name}"

    @property
    def ok(self) -> bool:
        """Whether it loaded."""
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``/readyz`` detail)."""
        return {"status": "loaded" if self.ok else "failed", "source": self.source, "tools": list(self.tools),
                "platforms": list(self.platforms), "commands": list(self.commands), "hooks": list(self.hooks),
                "error": self.error}


class PluginContext:
    """What a plugin's ``register(ctx)`` gets. Every other attribute is the tool registry's, so a plugin
    written as ``register(registry)`` (calling ``registry.register(...)``) works unchanged."""

    def __init__(self, name: str, tool_registry: ToolRegistry, *, allow_override: frozenset[str] = frozenset(),
                 taken_platforms: Iterable[str] = (), taken_commands: Iterable[str] = ()) -> None:
        self.name = name
        self.registry = tool_registry
        self._allow_override = allow_override
        self.platforms: list[PluginPlatform] = []
        self.commands: list[PluginCommand] = []
        self.hooks: list[PluginHook] = []
        self._taken_platforms = frozenset(taken_platforms)
        self._taken_commands = frozenset(taken_commands)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # private, or asked before __init__ ran (copy, pickle): never the registry's
            raise AttributeError(attr)
        return getattr(self.registry, attr)

    def register_tool(self, name: str, toolset: str, schema: dict[str, Any], handler: Handler,
                      **options: Any) -> bool:
        """``ToolRegistry.register`` (same parameters): False when the registry rejects the tool. Replacing a
        tool (``override=True``) that ``plugins.allow_override`` does not list raises ``PluginError``."""
        existing = self.registry.get(name)
        if options.get("override") and existing is not None and existing.handler is not handler:
            _check_overrides({name: existing.toolset}, self._allow_override)  # before the registry sees it
        return self.registry.register(name, toolset, schema, handler, **options)

    register = register_tool  # what a register(registry) plugin calls

    def register_platform(self, name: str, adapter_factory: Callable[[Any], Any],
                          config_model: type[BaseModel]) -> None:
        """Provide chat platform ``name``, configured under ``platforms.<name>`` (validated by ``config_model``,
        a pydantic model) and built by ``adapter_factory(settings)`` when enabled."""
        if not _PLATFORM_NAME.fullmatch(name):
            raise PluginError(f"invalid platform name {name!r} (use 1-32 lowercase letters, digits or '_', "
                              "starting with a letter)")
        if name in self._taken_platforms or any(p.name == name for p in self.platforms):
            raise PluginError(f"platform {name!r} is already provided (built in, or by another plugin)")
        if not callable(adapter_factory):
            raise PluginError(f"platform {name!r}: adapter_factory is not callable")
        if not (isinstance(config_model, type) and issubclass(config_model, BaseModel)):
            raise PluginError(f"platform {name!r}: config_model must be a pydantic model class")
        self.platforms.append(PluginPlatform(name, self.name, adapter_factory, config_model))

    def register_command(self, name: str, description: str, handler: Callable[..., Any], *,
                         admin_only: bool = False) -> None:
        """Add chat command ``/name``: ``handler(ctx)`` gets the gateway's ``CommandContext`` (``ctx.args``,
        ``ctx.event``) and returns the reply text (or an awaitable of it)."""
        name = name.removeprefix("/")
        if not _COMMAND_NAME.fullmatch(name):
            raise PluginError(f"invalid command name {name!r} (use 1-32 lowercase letters, digits or '_')")
        if name in self._taken_commands or any(c.name == name for c in self.commands):
            raise PluginError(f"command /{name} already exists (built in, or from another plugin)")
        if not callable(handler):
            raise PluginError(f"command /{name}: handler is not callable")
        self.commands.append(PluginCommand(name, self.name, description, handler, admin_only))

    def register_hook(self, kind: str, fn: Callable[..., Any]) -> None:
        """Add a hook of ``kind`` (``HOOK_KINDS``); see ``model_tools.register_hook`` for each one's signature."""
        if kind not in HOOK_KINDS:
            raise PluginError(f"unknown hook kind {kind!r} (one of {', '.join(HOOK_KINDS)})")
        if not callable(fn):
            raise PluginError(f"{kind} hook is not callable")
        self.hooks.append(PluginHook(kind, self.name, fn))


@dataclass(slots=True)
class _Change:
    name: str
    previous: ToolEntry | None
    current: ToolEntry


class LoadedPlugins:
    """The outcome of ``load_plugins`` (``statuses``, in load order, and what the loaded ones registered
    besides tools); ``unload`` undoes it."""

    def __init__(self, tool_registry: ToolRegistry, *, allow_override: Iterable[str] = (),
                 reserved_platforms: Iterable[str] = (), reserved_commands: Iterable[str] = ()) -> None:
        self.statuses: list[PluginStatus] = []
        self.platforms: dict[str, PluginPlatform] = {}
        self.commands: dict[str, PluginCommand] = {}
        self.hooks: list[PluginHook] = []
        self._registry = tool_registry
        self._allow_override = frozenset(allow_override)
        self._reserved_platforms = frozenset(reserved_platforms)
        self._reserved_commands = frozenset(reserved_commands)
        self._changes: list[list[_Change]] = []

    def unload(self) -> None:
        """Remove the plugins' tools and bring back the tools they overrode (newest plugin first); forget
        their platforms, commands and hooks (the gateway removes what it installed of them)."""
        for changes in reversed(self._changes):
            _revert(self._registry, changes)
        self._changes.clear()
        self.platforms.clear()
        self.commands.clear()
        self.hooks.clear()

    def _load(self, name: str, source: str, load: Callable[[], object]) -> None:
        reg = self._registry
        if not _PLUGIN_NAME.fullmatch(name):
            error = "invalid plugin name (use 1-64 letters, digits, '_' or '-')"
        elif any(s.name == name for s in self.statuses):
            error = "another plugin has the same name"
        else:
            before = reg.snapshot()
            ctx = PluginContext(name, reg, allow_override=self._allow_override,
                                taken_platforms=self._reserved_platforms | self.platforms.keys(),
                                taken_commands=self._reserved_commands | self.commands.keys())
            try:
                _run_plugin(load(), ctx)
                changes = _diff(before, reg.snapshot())
                # What a plugin registered on the registry itself (at import) is checked here, after the fact.
                _check_overrides({c.name: c.previous.toolset for c in changes if c.previous is not None},
                                 self._allow_override)
            except (Exception, SystemExit) as exc:
                _revert(reg, _diff(before, reg.snapshot()))
                error = sanitize_error_text(str(exc) if isinstance(exc, PluginError)
                                            else f"{type(exc).__name__}: {exc}", 300)
            else:
                self._keep(name, source, ctx, changes)
                return
        logger.error("plugin %s (%s) not loaded: %s", name, source, error)
        self.statuses.append(PluginStatus(name, source, error=error))

    def _keep(self, name: str, source: str, ctx: PluginContext, changes: list[_Change]) -> None:
        elsewhere = sorted(c.name for c in changes if c.current.toolset != f"plugin-{name}")
        if elsewhere:
            logger.warning("plugin %s registered %s outside toolset plugin-%s", name, elsewhere, name)
        self._changes.append(changes)
        self.platforms.update((p.name, p) for p in ctx.platforms)
        self.commands.update((c.name, c) for c in ctx.commands)
        self.hooks += ctx.hooks
        self.statuses.append(PluginStatus(name, source, tuple(sorted(c.name for c in changes)),
                                          platforms=tuple(p.name for p in ctx.platforms),
                                          commands=tuple(c.name for c in ctx.commands),
                                          hooks=tuple(h.kind for h in ctx.hooks)))
        logger.info("plugin %s loaded from %s: %d tools, %d platforms, %d commands, %d hooks", name, source,
                    len(changes), len(ctx.platforms), len(ctx.commands), len(ctx.hooks))


def _check_overrides(replaced: dict[str, str], allowed: frozenset[str]) -> None:
    """A plugin replacing a tool (name: its toolset) the operator did not list in ``plugins.allow_override`` fails."""
    refused = {name: toolset for name, toolset in replaced.items() if name not in allowed}
    if refused:
        what = ", ".join(f"{name} (toolset {toolset})" for name, toolset in refused.items())
        raise PluginError(f"replacing {what} needs plugins.allow_override: [{', '.join(refused)}] "
                          "besides override=True")


def _restore(reg: ToolRegistry, entry: ToolEntry) -> None:
    reg.register(entry.name, entry.toolset, entry.schema, entry.handler, check_fn=entry.check_fn,
                 requires_env=entry.requires_env, is_async=entry.is_async, description=entry.description,
                 emoji=entry.emoji, max_result_size_chars=entry.max_result_size_chars,
                 dynamic_schema_overrides=entry.dynamic_schema_overrides, effects=entry.effects,
                 isolation=entry.isolation, network=entry.network, override=True)


def _revert(reg: ToolRegistry, changes: list[_Change]) -> None:
    for change in reversed(changes):
        if reg.get(change.name) is not change.current:
            continue  # replaced again since: not ours to undo
        if change.previous is None:
            reg.deregister(change.name)
        else:
            _restore(reg, change.previous)


def _diff(before: dict[str, ToolEntry], after: dict[str, ToolEntry]) -> list[_Change]:
    return [_Change(name, before.get(name), entry) for name, entry in after.items() if before.get(name) is not entry]


def _run_plugin(loaded: object, ctx: PluginContext) -> None:
    hook = getattr(loaded, "register", None) if isinstance(loaded, ModuleType) else loaded
    if callable(hook):
        hook(ctx)


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> object:
    # A module that registers at import must run again after an unload, so re-import it.
    if ep.attr is None and ep.module in sys.modules:
        return importlib.reload(sys.modules[ep.module])
    return ep.load()


def _forget_module(name: str) -> None:
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def _load_file(path: Path) -> ModuleType:
    """Run a plugin file, or a plugin package's ``__init__.py`` (its submodules import relative to it)."""
    name = _MODULE_PREFIX + _plugin_name(path)
    _forget_module(name)  # a package's submodules too: a new load runs the plugin's current code
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickling and relative imports look the module up while it runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        _forget_module(name)
        raise
    return module


def _directory_plugins(directory: Path) -> list[Path]:
    """``*.py`` files and packages of ``directory``, by name; names starting with ``_`` or ``.`` are skipped."""
    found = [path for path in directory.iterdir()
             if not path.name.startswith(("_", "."))
             and ((path.suffix == ".py" and path.is_file()) or (path / "__init__.py").is_file())]
    return sorted(found, key=_plugin_name)


def _plugin_name(path: Path) -> str:
    return path.name if path.is_dir() else path.stem


def load_plugins(directory: Path | None = None, *, entry_points: bool = True,
                 tool_registry: ToolRegistry = registry, allow_override: Iterable[str] = (),
                 reserved_platforms: Iterable[str] = (), reserved_commands: Iterable[str] = ()) -> LoadedPlugins:
    """Load entry-point plugins (when ``entry_points``) and then the plugins of ``directory``.

    ``allow_override``: the tools a plugin may replace (with ``override=True``); ``reserved_platforms`` and
    ``reserved_commands``: names a plugin may not take (the built-in ones). Never raises for a broken plugin;
    see each ``PluginStatus``.
    """
    result = LoadedPlugins(tool_registry, allow_override=allow_override, reserved_platforms=reserved_platforms,
                           reserved_commands=reserved_commands)
    if entry_points:
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            result._load(ep.name, f"entry point {ep.value}", lambda ep=ep: _load_entry_point(ep))
    if directory is not None:
        for path in _directory_plugins(directory):
            result._load(_plugin_name(path), str(path), lambda path=path: _load_file(path))
    return result
