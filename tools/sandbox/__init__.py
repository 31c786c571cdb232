"""The tool sandbox: tools that run commands or parse untrusted input run in worker processes that
see only the workspace, hold no secrets, and are killed at their limits (see ``policy`` and ``pool``)."""

from tools.sandbox.policy import MODES, Isolation, SandboxPolicy, detect
from tools.sandbox.pool import SandboxLimits, SandboxPool
from tools.sandbox.settings import ToolSettings

__all__ = ["MODES", "Isolation", "SandboxLimits", "SandboxPolicy", "SandboxPool", "ToolSettings", "detect"]
