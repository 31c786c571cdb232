"""Process-wide tool settings that a sandbox worker must apply as the gateway does."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tools.code_execution_tool import CodeExecutionSettings, configure_execute_code
from tools.url_safety import configure_url_safety
from tools.web_tools import configure_web_search


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """The operator's tool configuration, in a form that crosses the pipe to a worker."""

    web_search_url: str | None = None
    allow_private_networks: tuple[str, ...] = ()
    execute_code: CodeExecutionSettings = field(default_factory=CodeExecutionSettings)

    def apply(self) -> None:
        """Configure this process's tools."""
        configure_web_search(self.web_search_url)
        configure_url_safety(self.allow_private_networks)
        configure_execute_code(self.execute_code)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolSettings:
        """Inverse of ``to_dict``."""
        return cls(data.get("web_search_url"), tuple(data.get("allow_private_networks") or ()),
                   execute_code=CodeExecutionSettings(**data.get("execute_code") or {}))


def reset_tool_settings() -> None:
    """Leave the process-wide tool settings as a fresh process has them."""
    ToolSettings().apply()
