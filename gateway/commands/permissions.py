"""Which commands this gateway has turned on, and which are for its admins only (``commands`` config)."""

from __future__ import annotations

from gateway.commands.base import COMMANDS
from gateway.config import Config
from platforms.base import MenuCommand


def enabled(cfg: Config, name: str) -> bool:
    """Whether ``/name`` (or its command, for an alias) is on."""
    return COMMANDS[name].name not in cfg.commands.disabled


def admin_only(cfg: Config, name: str) -> bool:
    """Whether only gateway admins may use ``/name``: registered so, or listed in ``commands.admin_only``."""
    entry = COMMANDS[name]
    return entry.admin_only or entry.name in cfg.commands.admin_only


def menu_commands(cfg: Config) -> list[MenuCommand]:
    """What platforms list in their native command menus: each enabled command everyone may use (no aliases)."""
    entries = {entry.name: entry for entry in COMMANDS.values()}
    return [MenuCommand(name, entry.description) for name, entry in sorted(entries.items())
            if enabled(cfg, name) and not admin_only(cfg, name)]
