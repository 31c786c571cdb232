"""What a sandbox worker sees, and which isolation this machine can give it.

The view is a list of what is visible (bubblewrap's way), never a list of what is hidden: the
system's programs and libraries read-only, the Python installation and the ``tools`` package
read-only, a few files of ``/etc`` that name resolution and TLS need, a private ``/tmp``, and
the workspace, the one writable path. Nothing of the gateway's home (config, ``.env``, state
database) is mounted, and the environment is built from an allowlist.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import tools

Level = Literal["bwrap", "unshare", "uid", "none", "unavailable"]
MODES = ("auto", "bwrap", "unshare", "uid", "none")

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
_ETC_FILES = (
    "/etc/resolv.conf", "/etc/hosts", "/etc/host.conf", "/etc/nsswitch.conf", "/etc/gai.conf",
    "/etc/services", "/etc/protocols", "/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/passwd",
    "/etc/group", "/etc/localtime", "/etc/timezone", "/etc/ld.so.cache", "/etc/ld.so.conf",
    "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/mime.types", "/etc/magic", "/etc/bash.bashrc",
    "/etc/profile", "/etc/inputrc", "/etc/os-release", "/etc/debian_version",
)
_ENV_PASSED = ("LANG", "LANGUAGE", "TZ")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOBODY = 65534
_PROBE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """The inputs of a worker's view."""

    workspace: Path
    read_only: tuple[Path, ...] = ()  # extra read-only paths (the plugins directory)
    uid: int = NOBODY  # who the worker runs as when the gateway runs as root
    sensitive: tuple[Path, ...] = ()  # the gateway's own files: config, .env, state (checked in uid mode)


@dataclass(frozen=True, slots=True)
class Isolation:
    """The isolation the sandbox will use, and why (``hermes-gateway check`` prints both)."""

    level: Level
    reason: str
    requested: str = "auto"

    @property
    def available(self) -> bool:
        """Whether sandboxed tools can be offered (``none`` runs them in the gateway, by choice)."""
        return self.level != "unavailable"

    def describe(self) -> str:
        """One line for ``check`` and the start-up log."""
        return f"{self.level}: {self.reason}"


def python_paths() -> list[Path]:
    """The Python installation and virtualenv the worker's interpreter needs, and the ``tools`` package."""
    paths = {Path(sys.base_prefix), Path(sys.prefix), Path(os.path.realpath(sys.executable)).parent.parent,
             Path(tools.__file__).resolve().parent}
    return sorted(p for p in paths if p.exists())


def worker_command() -> list[str]:
    """The interpreter, isolated from PYTHON* variables and the user's site directory, running the worker."""
    return [sys.executable, "-I", "-m", "tools.sandbox.worker"]


def sandbox_env(workspace: Path, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The worker's whole environment: fixed values and a few harmless ones from ``source``."""
    source = os.environ if source is None else source
    env = {"PATH": SANDBOX_PATH, "HOME": "/tmp", "TMPDIR": "/tmp", "TERM": "dumb", "USER": "sandbox",
           "LOGNAME": "sandbox", "SHELL": "/bin/sh", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "HERMES_WORKSPACE": str(workspace)}
    env.update({k: source[k] for k in _ENV_PASSED if source.get(k)})
    return env


def _bind_system(argv: list[str]) -> None:
    for name in _SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():  # merged /usr: /bin -> usr/bin
            argv += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            argv += ["--ro-bind", name, name]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in _ETC_FILES:
        argv += ["--ro-bind-try", name, name]


def _make_parents(argv: list[str], mounts: Sequence[Path]) -> None:
    """Create the mount points' parent directories world-readable (bubblewrap makes them 0700 when it
    runs as root, which would lock the worker out once it drops to its own user)."""
    made: set[Path] = set()
    for mount in mounts:
        for parent in reversed(mount.parents):
            if parent in (Path("/"), Path("/tmp")) or parent in made or str(parent) in _SYSTEM_DIRS:
                continue
            made.add(parent)
            argv += ["--perms", "0755", "--dir", str(parent)]


def _view(policy: SandboxPolicy, *, network: bool, read_only: Sequence[Path]) -> list[str]:
    """bubblewrap's options for a sandbox's view (namespaces, mounts), without user handling or environment."""
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if not network:
        argv.append("--unshare-net")
    _bind_system(argv)
    # The private /tmp first: the binds below may sit under /tmp, and a later tmpfs would hide them.
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    paths = [*python_paths(), *policy.read_only, *read_only]
    _make_parents(argv, [*paths, policy.workspace])
    for path in paths:
        argv += ["--ro-bind-try", str(path), str(path)]
    workspace = str(policy.workspace)
    return [*argv, "--bind", workspace, workspace, "--chdir", workspace]


def bwrap_argv(policy: SandboxPolicy, *, network: bool, as_root: bool, command: Sequence[str]) -> list[str]:
    """The bubblewrap command line that runs a worker (``command``) in its view.

    As root there is no user namespace: bubblewrap keeps only CAP_SETUID/CAP_SETGID so the worker can
    switch to ``policy.uid`` (then the per-user process limit counts the sandbox's processes, which it
    does not for root). Otherwise an unprivileged user namespace, where the limit counts them too.
    """
    argv = _view(policy, network=network, read_only=())
    if as_root:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv.append("--unshare-user")
    argv.append("--clearenv")
    for key, value in sandbox_env(policy.workspace).items():
        argv += ["--setenv", key, value]
    return [*argv, "--", *command]


def unshare_argv(policy: SandboxPolicy, *, network: bool, as_root: bool, command: Sequence[str],
                 staging: Path) -> list[str]:
    """The same view as ``bwrap_argv`` without bubblewrap: util-linux ``unshare`` makes the namespaces (a user
    namespace too unless root) and ``tools.sandbox.jail`` assembles the root from the same lists in an empty
    ``staging`` directory, then execs ``command`` with no capabilities (as root the worker then switches user)."""
    argv = [shutil.which("unshare") or "unshare", "--fork", "--pid", "--mount", "--ipc", "--uts", "--kill-child"]
    if not network:
        argv.append("--net")
    if not as_root:
        argv += ["--user", "--map-root-user"]
    links = [[os.readlink(name), name] for name in _SYSTEM_DIRS if Path(name).is_symlink()]
    read_only = [name for name in _SYSTEM_DIRS if not Path(name).is_symlink() and Path(name).is_dir()]
    read_only += [*_ETC_FILES, *(str(p) for p in [*python_paths(), *policy.read_only])]
    spec = {"root": str(staging), "symlinks": links, "read_only": read_only, "writable": [str(policy.workspace)],
            "chdir": str(policy.workspace), "network": network, "user_namespace": not as_root,
            "env": sandbox_env(policy.workspace), "argv": list(command)}
    return [*argv, "--", sys.executable, "-I", "-m", "tools.sandbox.jail", json.dumps(spec)]


def program_argv(policy: SandboxPolicy, command: str, args: Sequence[str]) -> list[str]:
    """The bubblewrap command line for a program of the operator's (a stdio MCP server) in the same view,
    with network. Its program and the files its arguments name are mounted read-only (relative paths made
    absolute); it runs as ``policy.uid`` when the gateway is root, else in a user namespace; its environment
    is what its launcher passes (the MCP SDK's minimal one plus the server's configured ``env``), with HOME
    and TMPDIR in the private /tmp. FileNotFoundError when there is no such program."""
    program = shutil.which(command)
    if program is None:  # bubblewrap would only say the connection closed
        raise FileNotFoundError(f"no such program: {command}")
    named: list[Path] = []
    resolved_args: list[str] = []
    for arg in [program, *args]:
        path = Path(arg)
        if not arg.startswith("-") and path.exists():
            path = Path(os.path.abspath(path))  # not resolved: a virtualenv's python must stay a link into it
            named.append(path if path.is_dir() else path.parent)
            arg = str(path)
        resolved_args.append(arg)
    argv = _view(policy, network=True, read_only=[p for p in named if not _is_system(p)])
    argv += ["--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
    if os.geteuid() == 0:  # as the worker does: bubblewrap keeps only the right to switch, then we switch
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                 sys.executable, "-I", "-m", "tools.sandbox.drop", str(policy.uid)]
    else:
        argv.append("--unshare-user")
    return [*argv, "--", *resolved_args]


def _is_system(path: Path) -> bool:
    return any(path.is_relative_to(d) for d in _SYSTEM_DIRS)


def _runs(argv: list[str], **kwargs: object) -> str | None:
    """None when ``argv`` exits 0, else what went wrong (its stderr's last line)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT, check=False,
                              **kwargs)  # type: ignore[call-overload]
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout or f"exit status {done.returncode}").strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def _probe_bwrap(policy: SandboxPolicy) -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    with tempfile.TemporaryDirectory() as workspace:  # the real one may not exist yet
        argv = bwrap_argv(replace(policy, workspace=Path(workspace)), network=False, as_root=os.geteuid() == 0,
                          command=[sys.executable, "-I", "-c", "import tools.sandbox.worker"])
        error = _runs(argv, stdin=subprocess.DEVNULL)
    return None if error is None else f"bubblewrap cannot create the sandbox here ({error})"


def _readable_by_others(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group can read ``path``: the file readable by
    others and every directory above it searchable by them (a 0700 home hides a 0644 file)."""
    try:
        return bool(path.stat().st_mode & 0o004) and all(d.stat().st_mode & 0o001 for d in path.absolute().parents)
    except OSError:
        return False


def _probe_uid(policy: SandboxPolicy) -> str | None:
    if os.geteuid() != 0:
        return "a separate user needs the gateway to run as root"
    exposed = [str(p) for p in policy.sensitive if _readable_by_others(p)]
    if exposed:
        return f"the gateway's files are readable by other users: chmod o-r {' '.join(exposed)}"
    error = _runs([sys.executable, "-I", "-c", "import tools.sandbox.worker"], user=policy.uid, group=policy.uid,
                  extra_groups=[], cwd="/", env=sandbox_env(policy.workspace), stdin=subprocess.DEVNULL)
    return None if error is None else f"user {policy.uid} cannot start the Python interpreter ({error})"


def _probe_unshare(policy: SandboxPolicy) -> str | None:
    if shutil.which("unshare") is None:
        return "util-linux unshare is not installed"
    with tempfile.TemporaryDirectory() as workspace, tempfile.TemporaryDirectory() as staging:
        argv = unshare_argv(replace(policy, workspace=Path(workspace)), network=False, as_root=os.geteuid() == 0,
                            command=[sys.executable, "-I", "-c", "import tools.sandbox.worker"],
                            staging=Path(staging))
        error = _runs(argv, stdin=subprocess.DEVNULL)
    return None if error is None else f"unshare cannot create the sandbox here ({error})"


def detect(mode: str, policy: SandboxPolicy) -> Isolation:
    """The isolation for ``tools.sandbox: mode``: what was asked for if it works, else the best that does."""
    if mode == "none":
        return Isolation("none", "tools.sandbox is none: sandboxed tools run inside the gateway, with its "
                                 "secrets and files in reach", mode)
    problems: list[str] = []
    if mode in ("auto", "bwrap"):
        error = _probe_bwrap(policy)
        if error is None:
            who = f"as uid {policy.uid}" if os.geteuid() == 0 else "in a user namespace"
            return Isolation("bwrap", f"bubblewrap: own PID, mount, IPC and network namespaces, {who}", mode)
        problems.append(error)
    if mode in ("auto", "unshare"):
        error = _probe_unshare(policy)
        if error is None:
            who = f"as uid {policy.uid}" if os.geteuid() == 0 else "in a user namespace"
            return Isolation("unshare", f"{'; '.join(problems) + '; ' if problems else ''}unshare: own PID, "
                                        f"mount, IPC and network namespaces, {who}", mode)
        problems.append(error)
    if mode in ("auto", "uid"):
        error = _probe_uid(policy)
        if error is None:
            return Isolation("uid", f"{'; '.join(problems) + '; ' if problems else ''}falling back to a "
                                    f"separate user (uid {policy.uid}), without namespaces", mode)
        problems.append(error)
    return Isolation("unavailable", "; ".join(problems) + ". Sandboxed tools (terminal, files, web) are "
                     "not offered; install bubblewrap, or set tools.sandbox: none to run them inside the "
                     "gateway (not recommended)", mode)
