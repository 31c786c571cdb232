"""The ``approvals`` section and the pattern lists that grant standing approvals (gateway/approvals.py)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator

from gateway.config.base import _Section, _unknown_toolsets
from gateway.config.errors import _invalid, _raise_if, _suggest
from tools.approval_rules import PATTERNS

ApprovalMode = Literal["never", "dangerous", "always"]
"""never: no call waits; dangerous: calls the classifier or a declared effect flags; always: every call of a tool
that declares a side effect."""

_PATTERN = re.compile(r"[a-z0-9_*.-]+:[a-z0-9_*.-]+|\*")
_EFFECTS = ("writes_files", "runs_commands", "sends_messages", "writes_state", "schedules")


def _check_patterns(value: list[str]) -> list[str]:
    for pattern in value:
        if not _PATTERN.fullmatch(pattern):
            raise _invalid(f"invalid approval pattern {pattern!r}",
                           "write <tool>:<pattern> such as terminal:destructive-delete, <tool>:* or "
                           "<tool>:<effect>; * for all")
        if pattern.startswith("terminal:") and "*" not in pattern and pattern not in PATTERNS:
            raise _invalid(f"unknown terminal pattern {pattern!r}", _suggest(pattern, sorted(PATTERNS)))
    return value


def _check_effects(value: list[str]) -> list[str]:
    for effect in value:
        if effect not in _EFFECTS:
            raise _invalid(f"unknown side effect {effect!r}", _suggest(effect, list(_EFFECTS)))
    return value


Patterns = Annotated[list[str], AfterValidator(_check_patterns)]


class ApprovalSettings(_Section):
    """When a tool call waits for a chat user's yes, and what runs nobody can ask (webhooks, cron) may do."""

    # User keys are written like auth.admins: telegram:123.
    model_config = ConfigDict(coerce_numbers_to_str=True)

    mode: ApprovalMode = "dangerous"
    # Per toolset, instead of mode (e.g. hermes-discord: always).
    toolsets: dict[str, ApprovalMode] = Field(default_factory=dict)
    # A prompt nobody answers in this time is a denial; the model is told.
    timeout_minutes: float = Field(30.0, gt=0, le=7 * 24 * 60)
    # Commands that reach the network (curl, git clone, ssh, package installs) count as dangerous.
    network: bool = False
    # Tools declaring any of these side effects wait for approval in mode dangerous (terminal has its classifier).
    ask_for_effects: Annotated[list[str], AfterValidator(_check_effects)] = Field(default_factory=list)
    # Standing approvals an operator gives: user key -> patterns (as a user's "always" answer would).
    trusted: dict[str, Patterns] = Field(default_factory=dict)
    # What scheduled (cron) runs may do of what would otherwise need an approval; the rest is denied.
    cron_allow: Patterns = Field(default_factory=list)

    @field_validator("toolsets")
    @classmethod
    def _known_toolsets(cls, value: dict[str, ApprovalMode]) -> dict[str, ApprovalMode]:
        _raise_if([p for name in value for p in _unknown_toolsets(name, plugins=True)])
        return value
