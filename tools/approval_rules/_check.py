"""Checking parsed commands: the scan's state, dispatch through wrappers, brace expansion, workspace paths."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from tools.approval_rules._shell import (
    MAX_HOPS,
    WRAPPERS,
    Budget,
    Cmd,
    Lexer,
    Opaque,
    Parser,
    Word,
    command_name,
    download_in,
    unwrap,
)

MAX_COMMAND_CHARS = 100_000

DESTRUCTIVE_DELETE = "terminal:destructive-delete"
PRIVILEGE_ESCALATION = "terminal:privilege-escalation"
REMOTE_CODE = "terminal:remote-code"
GIT_FORCE_PUSH = "terminal:git-force-push"
GIT_REWRITE = "terminal:git-rewrite"
PACKAGE_INSTALL = "terminal:package-install"
WRITE_OUTSIDE = "terminal:write-outside-workspace"
NETWORK = "terminal:network"
OPAQUE = "terminal:opaque"

PATTERNS: dict[str, str] = {
    DESTRUCTIVE_DELETE: "Deletes or wipes more than named files: rm -r/-f, find -delete or -exec rm, git clean -f, "
    "rsync --delete, shred, wipefs, mkfs.",
    PRIVILEGE_ESCALATION: "Runs as another user or grants privileges: sudo, su, doas, pkexec, runuser, "
    "setuid/setgid chmod, chown to root.",
    REMOTE_CODE: "Runs code straight from the network: a download piped or fed into a shell or interpreter, "
    'sh <(curl ...), sh -c "$(curl ...)".',
    GIT_FORCE_PUSH: "Overwrites or deletes remote git history: push --force/-f/--force-with-lease/--mirror/--delete "
    "or a +refspec.",
    GIT_REWRITE: "Rewrites local git history or discards uncommitted work: reset --hard, rebase, branch -D, "
    "checkout -f, restore, stash drop.",
    PACKAGE_INSTALL: "Installs, upgrades or removes packages: pip, npm/yarn/pnpm, npx, apt, dnf/yum, apk, brew, "
    "cargo, gem, go install, ...",
    WRITE_OUTSIDE: "Writes, moves or deletes a path outside the workspace (absolute, ~, .., a variable, or after cd "
    "out of it).",
    NETWORK: "Reaches the network (reported only when network access needs approval): curl, wget, ssh, git "
    "clone/fetch/push, installs, ...",
    OPAQUE: "Cannot be inspected: a parse error, too long or too nested, or code computed at run time (eval, "
    'sh -c "$VAR", $CMD, a pipe into sh).',
}

WORK_PER_CHAR = 8  # characters the lexers and scanners may read, per character of the command
_MAX_BRACE_WORDS = 64
_REASON_CHARS = 120
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "<>", "&>", "&>>", ">&"})
_HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
PRIVILEGED = frozenset({"sudo", "su", "doas", "pkexec", "run0", "runuser", "sudoedit"})


@dataclass(frozen=True, slots=True)
class Danger:
    """One reason a command needs approval."""

    pattern: str  # stable id, "terminal:<kebab-case>", a key of PATTERNS
    reason: str  # one short human line naming what was found, e.g. "recursive delete: rm -rf build/"


@dataclass(slots=True)
class Scan:
    """The state of one classification: its settings, budget, current directory and the dangers found."""

    workspace: str | None
    network: bool
    budget: Budget
    cwd: str | None = "."  # where relative paths start, relative to the workspace; None: outside or unknown
    depth: int = 0
    handlers: Mapping[str, Handler] = field(default_factory=dict)  # command family -> its checks
    found: dict[str, Danger] = field(default_factory=dict)

    def add(self, pattern: str, reason: str) -> None:
        """Record a danger unless its pattern was already found (the first reason wins)."""
        if pattern not in self.found:
            line = " ".join(reason.split())
            clipped = line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."
            self.found[pattern] = Danger(pattern, clipped)


Handler = Callable[[list[Word], Cmd, Scan, int], None]


def check_script(text: str, scan: Scan) -> None:
    """Parse ``text`` as shell commands and check each; what cannot be parsed is opaque."""
    scan.depth += 1
    try:
        out: list[Cmd] = []
        Parser(Lexer(text, scan.budget), out, scan.budget, scan.depth).parse_list(frozenset())
    except Opaque as exc:
        scan.add(OPAQUE, f"cannot inspect ({exc}): {text}")
        out = []
    try:
        for cmd in out:
            try:
                check_command(cmd, scan)
            except Opaque as exc:
                scan.add(OPAQUE, f"cannot inspect ({exc}): {show(cmd.words)}")
    finally:
        scan.depth -= 1


def check_command(cmd: Cmd, scan: Scan) -> None:
    """Check one simple command: its words (braces expanded) and its redirections."""
    if cmd.words and not cmd.header:
        check_argv(expand_braces(cmd.words, scan.budget), cmd, scan, 0)
    for redirect in cmd.redirects:
        target = redirect.target.text
        if redirect.op in _WRITE_REDIRECTS and not (redirect.op == ">&" and (target.isdigit() or target == "-")):
            check_targets([redirect.target], f"{redirect.op} {target}", scan)


def check_argv(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    """Check the command ``argv`` runs, through wrappers (``hops`` of them so far), with its family's handler."""
    head, shown = argv[0], show(argv)
    if head.dynamic:
        if (download := download_in(head)) is not None:
            scan.add(REMOTE_CODE, f"runs what a download prints: $({show(download.words)}) {show(argv[1:])}")
        else:
            scan.add(OPAQUE, f"command name computed at run time: {shown}")
        return
    name = command_name(head.text)
    if not name:
        return
    if (set("*?[") & set(name) and name not in ("[", "[[")) or ("{" in name and "," in name):
        scan.add(OPAQUE, f"command name is a pattern: {shown}")
        return
    if hops >= MAX_HOPS:
        scan.add(OPAQUE, f"too many wrapper commands: {shown}")
        return
    if name in PRIVILEGED:
        scan.add(PRIVILEGE_ESCALATION, f"runs as another user: {shown}")
    spec = WRAPPERS.get(name)
    if spec is not None:
        inner, scripts = unwrap(spec, argv[1:])
        for script in scripts:
            check_script(script, scan)
        if inner:
            check_argv(inner, cmd, scan, hops + 1)
        return
    handler = scan.handlers.get(family(name))
    if handler is not None:
        handler(argv, cmd, scan, hops)


def show(words: Sequence[Word]) -> str:
    """Words as a reason quotes them."""
    return " ".join(word.text for word in words)


_VERSIONED = frozenset({"python", "pip", "pypy", "perl", "ruby", "lua", "php", "node"})


def family(name: str) -> str:
    """python3.11 -> python, pip3 -> pip, mkfs.ext4 -> mkfs."""
    base = name.rstrip("0123456789.")
    if base in _VERSIONED:
        return base
    return "mkfs" if name.startswith("mkfs.") else name


def expand_braces(words: list[Word], budget: Budget) -> list[Word]:
    """Unquoted words with ``{a,b}`` brace expansions expanded, as bash does."""
    out: list[Word] = []
    for word in words:
        if word.quoted or "{" not in word.text or "," not in word.text:
            out.append(word)
            continue
        done: list[str] = []
        pending = [word.text]
        while pending:
            text = pending.pop()
            group = _brace_group(text, budget)
            if group is None:
                done.append(text)
                continue
            cuts, end = group
            pending += reversed([text[: cuts[0]] + text[a + 1 : b] + text[end + 1 :] for a, b in pairwise(cuts)])
            if len(done) + len(pending) > _MAX_BRACE_WORDS:
                raise Opaque(f"brace expansion too large: {word.text}")
        out += [Word(text, subs=word.subs) for text in done]
    return out


def _brace_group(text: str, budget: Budget) -> tuple[list[int], int] | None:
    """The first ``{...,...}`` of text: the positions of its ``{``, its top-level commas and ``}``."""
    start = text.find("{")
    while start >= 0:
        budget.spend(len(text) - start)
        depth, cuts = 0, [start]
        for j in range(start, len(text)):
            ch = text[j]
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 1:
                cuts.append(j)
            if depth == 0:
                if len(cuts) > 1:
                    return [*cuts, j], j
                break
        start = text.find("{", start + 1)
    return None


def resolve(path: str, scan: Scan) -> str | None:
    """``path`` relative to the workspace root, or None when it is outside or cannot be known."""
    for variable, base in (("PWD", scan.cwd), ("HERMES_WORKSPACE", ".")):
        for prefix in (f"${variable}", f"${{{variable}}}"):
            if path == prefix or path.startswith(prefix + "/"):
                if base is None:
                    return None
                path = base + path[len(prefix) :]
    if path.startswith(("$", "`", "~")):
        return None
    if path.startswith("/"):
        if scan.workspace is None:
            return None
        relative = posixpath.relpath(posixpath.normpath(path), scan.workspace)
    elif scan.cwd is None:
        return None
    else:
        relative = posixpath.normpath(posixpath.join(scan.cwd, path))
    return None if relative == ".." or relative.startswith("../") else relative


def check_targets(targets: Sequence[Word], shown: str, scan: Scan) -> None:
    """Flag the first target written to that is outside the workspace (or cannot be known)."""
    for target in targets:
        if target.text and target.text not in _HARMLESS_TARGETS and resolve(target.text, scan) is None:
            what = "write to a path computed at run time" if target.text[0] in "$`" else "write outside the workspace"
            scan.add(WRITE_OUTSIDE, f"{what}: {shown}")
            return
