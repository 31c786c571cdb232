"""Python tool plugins: installed entry points and ``.py`` files in a plugins directory.

A plugin is either
- an entry point in group ``hermes_gateway.tools`` naming a callable (called with the registry)
  or a module (imported; it registers at import, or defines ``register(registry)``), or
- a ``<name>.py`` file in the plugins directory (run; same two styles).

Its tools register under toolset ``plugin-<name>``, the name being the entry point's or the
file's stem. A tool that replaces an existing one (a built-in) must pass ``override=True``; the
registry rejects and logs it otherwise. Loading one plugin is all-or-nothing: if it raises,
whatever it had registered is rolled back, the error is logged and reported in its status, and
the other plugins load as usual. ``LoadedPlugins.unload`` restores the registry as it was.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tools.registry import ToolEntry, ToolRegistry, registry, sanitize_error_text

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hermes_gateway.tools"
_PLUGIN_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MODULE_PREFIX = "hermes_gateway_plugin_"


@dataclass(frozen=True, slots=True)
class PluginStatus:
    """One plugin: where it came from, the tools it registered, or why it failed."""

    name: str
    source: str
    tools: tuple[str, ...] = ()
    error: str | None = None

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
                "error": self.error}


@dataclass(slots=True)
class _Change:
    name: str
    previous: ToolEntry | None
    current: ToolEntry


class LoadedPlugins:
    """The outcome of ``load_plugins`` (``statuses``, in load order); ``unload`` undoes it."""

    def __init__(self, tool_registry: ToolRegistry) -> None:
        self.statuses: list[PluginStatus] = []
        self._registry = tool_registry
        self._changes: list[list[_Change]] = []

    def unload(self) -> None:
        """Remove the plugins' tools and bring back the tools they overrode (newest plugin first)."""
        for changes in reversed(self._changes):
            _revert(self._registry, changes)
        self._changes.clear()

    def _load(self, name: str, source: str, load: Callable[[], object]) -> None:
        reg = self._registry
        if not _PLUGIN_NAME.fullmatch(name):
            error = "invalid plugin name (use 1-64 letters, digits, '_' or '-')"
        elif any(s.name == name for s in self.statuses):
            error = "another plugin has the same name"
        else:
            before = reg.snapshot()
            try:
                _run_plugin(load(), reg)
            except (Exception, SystemExit) as exc:
                _revert(reg, _diff(before, reg.snapshot()))
                error = sanitize_error_text(f"{type(exc).__name__}: {exc}", 300)
            else:
                changes = _diff(before, reg.snapshot())
                elsewhere = sorted(c.name for c in changes if c.current.toolset != f"plugin-{name}")
                if elsewhere:
                    logger.warning("plugin %s registered %s outside toolset plugin-%s", name, elsewhere, name)
                self._changes.append(changes)
                self.statuses.append(PluginStatus(name, source, tuple(sorted(c.name for c in changes))))
                logger.info("plugin %s loaded from %s: %d tools", name, source, len(changes))
                return
        logger.error("plugin %s (%s) not loaded: %s", name, source, error)
        self.statuses.append(PluginStatus(name, source, error=error))


def _restore(reg: ToolRegistry, entry: ToolEntry) -> None:
    reg.register(entry.name, entry.toolset, entry.schema, entry.handler, check_fn=entry.check_fn,
                 requires_env=entry.requires_env, is_async=entry.is_async, description=entry.description,
                 emoji=entry.emoji, max_result_size_chars=entry.max_result_size_chars,
                 dynamic_schema_overrides=entry.dynamic_schema_overrides, effects=entry.effects, override=True)


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


def _run_plugin(loaded: object, reg: ToolRegistry) -> None:
    hook = getattr(loaded, "register", None) if isinstance(loaded, ModuleType) else loaded
    if callable(hook):
        hook(reg)


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> object:
    # A module that registers at import must run again after an unload, so re-import it.
    if ep.attr is None and ep.module in sys.modules:
        return importlib.reload(sys.modules[ep.module])
    return ep.load()


def _load_file(path: Path) -> ModuleType:
    name = _MODULE_PREFIX + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while it runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_plugins(directory: Path | None = None, *, entry_points: bool = True,
                 tool_registry: ToolRegistry = registry) -> LoadedPlugins:
    """Load entry-point plugins (when ``entry_points``) and then the ``*.py`` files of ``directory``.

    Never raises for a broken plugin; see each ``PluginStatus``. Files starting with ``_`` are skipped.
    """
    result = LoadedPlugins(tool_registry)
    if entry_points:
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            result._load(ep.name, f"entry point {ep.value}", lambda ep=ep: _load_entry_point(ep))
    if directory is not None:
        for path in sorted(directory.glob("*.py")):
            if not path.stem.startswith("_"):
                result._load(path.stem, str(path), lambda path=path: _load_file(path))
    return result
