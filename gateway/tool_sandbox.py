"""The gateway's tool sandbox: which isolation this machine gives, and the worker pool built from config.

``start_sandbox`` installs the pool as the registry's sandbox runner, so every ``isolation="sandbox"``
tool call of every run goes to a worker; with ``tools.sandbox: none`` nothing is installed and those
tools run in the gateway (logged as a warning at every start); when no isolation works, the pool
refuses them and they are not offered to the model.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gateway.config import Config, ConfigError, gateway_home
from tools.code_execution_tool import CodeExecutionSettings
from tools.registry import registry
from tools.sandbox import Isolation, SandboxLimits, SandboxPolicy, SandboxPool, ToolSettings, detect

logger = logging.getLogger(__name__)


def _sqlite_file(url: str) -> Path | None:
    scheme, sep, rest = url.partition(":///")
    return Path(rest).expanduser() if sep and scheme.startswith("sqlite") else None


def sensitive_paths(cfg: Config, config_path: Path | None = None) -> list[Path]:
    """The gateway's own files, which no tool may see: its config (``config_path``, else the file ``cfg`` was
    loaded from), ``.env``, home and state database."""
    home = gateway_home()
    paths = [home / "config.yaml", home / ".env"]
    config_path = config_path or cfg.source
    if config_path is not None:
        paths += [config_path, config_path.parent / ".env"]
    db = _sqlite_file(cfg.store.url)
    if db is not None:
        paths += [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    return [Path(p).expanduser().resolve() for p in paths]


def sandbox_policy(cfg: Config, config_path: Path | None = None) -> SandboxPolicy:
    """What workers see; ConfigError when the workspace would expose the gateway's own files."""
    workspace = Path(cfg.gateway.workspace).expanduser().resolve()
    sensitive = sensitive_paths(cfg, config_path)
    inside = [p for p in sensitive if p.is_relative_to(workspace)]
    if inside:
        raise ConfigError("gateway.workspace", f"{workspace} holds the gateway's own files ({inside[0]}): "
                          "tools could read them", "use a directory of its own, e.g. ~/.hermes-gateway/workspace")
    plugins = (Path(cfg.plugins.dir).expanduser().resolve(),) if cfg.plugins.dir else ()
    return SandboxPolicy(workspace, plugins, cfg.tools.sandbox_uid, tuple(sensitive))


def detect_isolation(cfg: Config, config_path: Path | None = None) -> Isolation:
    """The isolation ``tools.sandbox`` gets on this machine, and why (for ``check`` and the start-up log)."""
    return detect(cfg.tools.sandbox, sandbox_policy(cfg, config_path))


def tool_settings(cfg: Config) -> ToolSettings:
    """The process-wide tool settings, as the gateway and every worker apply them."""
    code = cfg.tools.execute_code
    return ToolSettings(cfg.web.search_url, tuple(cfg.web.allow_private_networks), execute_code=CodeExecutionSettings(
        code.max_timeout, min(code.memory_mb, cfg.tools.limits.memory_mb), code.max_tool_calls,
        cfg.tools.network.get("execute_code", False)))


def start_sandbox(cfg: Config) -> SandboxPool | None:
    """Detect the isolation, log it, and install the pool as the registry's sandbox (None for ``none``)."""
    policy = sandbox_policy(cfg)
    isolation = detect(cfg.tools.sandbox, policy)
    if isolation.level == "none":
        logger.warning("tool sandbox disabled (tools.sandbox: none): terminal, file and web tools run inside "
                       "the gateway, with its secrets and files in reach")
        registry.sandbox = None
        registry.invalidate_check_fn_cache()
        return None
    if isolation.available:
        logger.info("tool sandbox: %s", isolation.describe())
    else:
        logger.warning("tool sandbox unavailable: %s", isolation.reason)
    limits = cfg.tools.limits
    pool = SandboxPool(isolation, policy,
                       SandboxLimits(limits.timeout, limits.cpu_seconds, limits.memory_mb, limits.open_files,
                                     limits.processes, limits.file_size_mb),
                       settings=tool_settings(cfg), plugins_dir=policy.read_only[0] if policy.read_only else None,
                       plugin_entry_points=cfg.plugins.entry_points,
                       plugin_allow_override=tuple(cfg.plugins.allow_override), max_workers=cfg.tools.workers,
                       network=cfg.tools.network)
    pool.start()
    registry.sandbox = pool
    registry.invalidate_check_fn_cache()  # cached plans were built without the sandbox's availability
    return pool


def stop_sandbox(pool: SandboxPool | None) -> None:
    """Kill the workers and uninstall the pool."""
    if registry.sandbox is pool:
        registry.sandbox = None
        registry.invalidate_check_fn_cache()
    if pool is not None:
        pool.close()
