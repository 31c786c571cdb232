"""Which ``terminal`` commands need a person's approval before they run.

``classify(command, workspace=..., network=...)`` parses a shell command and returns every
:class:`Danger` it finds, one per pattern, in order of appearance; ``[]`` means it may run
without asking. It sits beside ``tools.terminal_tool.blocked_reason``, which refuses a few
host-wrecking one-liners outright; this layer asks instead of refusing.

Patterns (``PATTERNS`` holds the same ids with a one-line description each):

``terminal:destructive-delete``
    rm with -r/-R/--recursive or -f/--force, with a bare ``*`` (``rm *``, ``rm dir/*``) or with
    unquoted arguments computed at run time (``rm $FLAGS x``); find -delete and find -exec/-ok
    rm/shred/unlink/rmdir; git clean -f; rsync --delete*/--remove-source-files; shred, wipe, srm,
    wipefs, mkfs. Plain ``rm FILE`` does not need approval (deliberate): it deletes the files it
    names, refuses directories and is confined to the workspace by the sandbox; a plain rm of a
    path outside the workspace is caught by ``terminal:write-outside-workspace``. Asking before
    every scratch-file delete would teach people to approve without reading.
``terminal:privilege-escalation``
    sudo, su, doas, pkexec, run0, runuser, sudoedit (anywhere, wrappers included); chmod or
    install -m giving setuid/setgid (u+s, g+s, 4755, 2755 ...); chown/chgrp/install -o|-g to root.
``terminal:remote-code``
    a download (curl, wget, nc, ssh, ...) piped into a shell or interpreter that reads its program
    from stdin (``curl x | sudo bash``, ``wget -O- x | python3 -``), fed by ``< <(curl ..)`` or
    ``<<< "$(curl ..)"``; a shell, interpreter, eval or source given a download as its script
    (``sh <(curl ..)``, ``bash -c "$(curl ..)"``, ``python -c "$(curl ..)"``, ``. <(curl ..)``);
    running what a download prints (``$(curl ..)`` as the command).
``terminal:git-force-push``
    git push with -f/--force/--force-with-lease/--force-if-includes/--mirror/-d/--delete/--prune
    or a ``+refspec`` / ``:branch`` refspec.
``terminal:git-rewrite``
    git reset --hard, rebase (but --abort/--quit), branch -D/-M/-C/-f/-d -f, checkout -f/-B/``--``
    paths/``.``, switch -f/-C/--discard-changes, restore of the working tree, stash drop/clear,
    reflog expire/delete, update-ref -d, filter-branch, filter-repo.
``terminal:package-install``
    installs, upgrades or removes packages: pip/pip3/python -m pip, uv, pipx, poetry, pipenv, pdm,
    conda/mamba, npm/yarn/pnpm/bun (local installs too: their install scripts run code), npx/bunx/
    uvx/pnpx, apt/apt-get/aptitude, dnf/yum/zypper, apk, brew, snap, flatpak, pacman -S/-U/-R,
    dpkg -i, rpm -i/-U, nix-env -i, gem, cargo install/add, go install/get, composer, dotnet, rustup.
``terminal:write-outside-workspace``
    redirections (>, >>, >|, &>, &>>, <>, 2>, >& file) and the targets of tee, cp, mv (sources too),
    install, ln, rsync/scp (local destination), touch, mkdir, rmdir, rm, unlink, truncate, dd of=,
    chmod/chown/chgrp, sed -i, curl -o/--output-dir, wget -O/-P, find -fprint: absolute paths not
    under ``workspace`` (any absolute path when it is None), ``~`` paths, relative paths escaping
    with ``..``, paths starting with a variable or a command substitution (``$PWD`` and
    ``$HERMES_WORKSPACE`` are resolved), and any relative path after a ``cd`` out of the workspace
    (or to somewhere unknown). /dev/null, /dev/stdout and /dev/stderr are fine.
``terminal:network``
    only with ``network=True``: curl, wget, nc/ncat/netcat, socat, telnet, ftp, lftp, ssh, scp,
    sftp, mosh, rsync to a host, ping, dig, nslookup, host, traceroute, whois, gh, http/xh, git
    clone/fetch/pull/push/ls-remote/submodule/remote update, aria2c, and every package install.
``terminal:opaque``
    what the classifier cannot see through, so it must ask: unbalanced quotes and other parse
    errors, input over ``MAX_COMMAND_CHARS`` or too deeply nested or too costly to inspect, a
    command name computed at run time (``$CMD``, ``$(..)``, ``"$@"``, globs), ``eval`` or
    ``sh -c`` of computed text, ``source``/``.``/``bash`` of a script named at run time, a shell
    or interpreter reading its program from a pipe (``base64 -d x | sh``), git ``-c`` settings
    that run commands (aliases, core.sshCommand, ...), over-large brace expansions.

How it reads a command: the stdlib ``shlex`` tokenizes it (posix, punctuation characters, no
comments), with what shlex forgets (whether a word was quoted, whether two tokens touch, where a
line ends) recovered from the raw text it consumed, so ``";"`` is a word and ``;`` an operator.
Commands split on ``;`` ``&&`` ``||`` ``|`` ``&`` and newlines; ``$( )``, backquotes, ``<( )``,
subshells, braces, if/while/for/case bodies and function bodies are looked into, as are the
scripts of ``sh -c``/``bash -c``/``su -c``/``env -S``/``flock -c``/``watch``/``eval``/``trap``/
``alias``/``git submodule foreach``, heredocs and here-strings fed to a shell, and the commands
behind wrappers (sudo, env, command, exec, nice, nohup, timeout, time, xargs, stdbuf, setsid,
ionice, taskset, chroot, busybox, find -exec, uv/poetry/pipenv run ...). Command words resolve by
basename (``/bin/rm``, ``\\rm``, ``"rm"``); leading ``NAME=value`` assignments are skipped;
unquoted brace expansions are expanded. Work is bounded: input over ``MAX_COMMAND_CHARS`` and
anything nested or costing more than a fixed budget per input character is opaque.

Known limits. This is an approval trigger, not a sandbox: the sandbox confines what runs. It
does not look inside scripts and programs (``sh build.sh``, ``python -c ...``, ``make``,
``npm run``, ``source env.sh``, git hooks or config), does not know variables' values (a path
like ``out/$f`` is assumed to stay inside; flags computed at run time are only considered for
rm), treats ``$(..)`` and backquotes inside single quotes as if they ran (asks more, never less),
expands braces only in unquoted words, does not link a download saved to a file to its later
execution (``curl -o x.sh URL && sh x.sh``: only ``terminal:network``), and does not inspect what
``ssh host CMD`` runs on the other host. ``cd`` is followed conservatively: once a command leaves
the workspace, relative targets count as outside for the rest of the command, subshells included.
Some valid shell it cannot tokenize and so reports as opaque (asks rather than guesses): a
double-quoted ``$( )`` whose own quoted arguments hold blanks (``"$(echo "a b")"``), a ``case``
pattern holding parentheses, a here-document inside multi-word backquotes.

Layout: ``_shell`` (tokens and parse), ``_check`` (the scan, dispatch, paths, ``PATTERNS``) and
``_commands`` (what each command family is checked for).
"""

from __future__ import annotations

import posixpath

from tools.approval_rules._check import (
    DESTRUCTIVE_DELETE,
    GIT_FORCE_PUSH,
    GIT_REWRITE,
    MAX_COMMAND_CHARS,
    NETWORK,
    OPAQUE,
    PACKAGE_INSTALL,
    PATTERNS,
    PRIVILEGE_ESCALATION,
    REMOTE_CODE,
    WORK_PER_CHAR,
    WRITE_OUTSIDE,
    Danger,
    Scan,
    check_script,
)
from tools.approval_rules._commands import HANDLERS
from tools.approval_rules._shell import Budget

__all__ = [
    "DESTRUCTIVE_DELETE",
    "GIT_FORCE_PUSH",
    "GIT_REWRITE",
    "MAX_COMMAND_CHARS",
    "NETWORK",
    "OPAQUE",
    "PACKAGE_INSTALL",
    "PATTERNS",
    "PRIVILEGE_ESCALATION",
    "REMOTE_CODE",
    "WRITE_OUTSIDE",
    "Danger",
    "classify",
]


def classify(command: str, *, workspace: str | None = None, network: bool = False) -> list[Danger]:
    """Every danger found in a shell command (deduplicated by pattern, in order of appearance); [] = safe."""
    if len(command) > MAX_COMMAND_CHARS:
        return [Danger(OPAQUE, f"command too long to inspect ({len(command)} characters, limit {MAX_COMMAND_CHARS})")]
    root = posixpath.abspath(workspace) if workspace else None
    scan = Scan(root, network, Budget(WORK_PER_CHAR * max(len(command), 1000)), handlers=HANDLERS)
    check_script(command, scan)
    return list(scan.found.values())
