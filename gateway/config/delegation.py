"""The ``delegation`` section: how ``delegate_task`` runs sub-agents (gateway/delegation.py)."""

from __future__ import annotations

from pydantic import Field, field_validator

from gateway.config.base import _Section, _unknown_toolsets
from gateway.config.errors import _raise_if


class DelegationSettings(_Section):
    """Sub-agents started by ``delegate_task``: how many run at once, how deep they nest, what they get."""

    # Tasks one delegate_task call may hand out, all running at once; one run's children at each nesting level
    # share this many slots (parallel delegate_task calls of one turn wait for each other's).
    max_concurrent_children: int = Field(3, ge=1, le=16)
    # How deep delegation nests: 1 means the run's children cannot delegate further.
    max_spawn_depth: int = Field(1, ge=1, le=4)
    # Model turns a sub-agent gets; null: model.max_turns.
    max_turns: int | None = Field(None, ge=1, le=100)
    # Toolsets a task that names none gets (always cut down to the delegating agent's own tools); empty: the
    # delegating agent's toolsets.
    default_toolsets: list[str] = Field(default_factory=list)

    @field_validator("default_toolsets")
    @classmethod
    def _known_toolsets(cls, value: list[str]) -> list[str]:
        _raise_if(_unknown_toolsets(value, plugins=True))
        return value
