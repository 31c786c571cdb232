"""The stdio test server (``stdio_server.py``), talking on stderr as many MCP servers do."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

print("noisy-server: starting up, nothing is wrong", file=sys.stderr, flush=True)
runpy.run_path(str(Path(__file__).with_name("stdio_server.py")), run_name="__main__")
