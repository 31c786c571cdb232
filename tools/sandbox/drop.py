"""``python -I -m tools.sandbox.drop UID -- PROGRAM [ARGS...]``: become UID (and its group, no other groups,
no capabilities), then run PROGRAM. How a program of the operator's (a stdio MCP server) gets the sandbox's
user when the gateway runs as root, inside bubblewrap, which kept only the capabilities to switch."""

from __future__ import annotations

import os
import sys

from tools.sandbox.worker import drop_privileges


def main(argv: list[str]) -> None:
    """Switch user, then exec the program (never returns)."""
    uid, separator, *program = argv
    if separator != "--" or not program:
        sys.exit("usage: python -m tools.sandbox.drop UID -- PROGRAM [ARGS...]")
    drop_privileges(int(uid), int(uid))
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
