"""Shell completion (argcomplete), as bash's completion function drives it: the console script run with the
completion protocol's environment, the candidates read from the file it writes them to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("hermes-gateway")


def _complete(line: str, tmp_path: Path) -> list[str]:
    out = tmp_path / "candidates"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out), "_ARGCOMPLETE_IFS": "\n"}
    done = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return sorted(out.read_text().split())


def test_subcommands_and_their_options_complete(tmp_path: Path) -> None:
    assert SCRIPT.is_file(), "the console script comes with `pip install -e .` (make test does it)"
    assert _complete("hermes-gateway pai", tmp_path) == ["pairing"]
    assert _complete("hermes-gateway pairing ", tmp_path) == ["--help", "-h", "approve", "list", "revoke"]
    assert "--json" in _complete("hermes-gateway runs list --", tmp_path)
    assert _complete("hermes-gateway --config x.yaml do", tmp_path) == ["doctor"]
