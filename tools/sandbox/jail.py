"""``python -I -m tools.sandbox.jail SPEC`` : build a sandbox's view with plain mount(2), then exec the worker.

Where bubblewrap is missing, the pool starts this under util-linux ``unshare`` (new mount, PID, IPC, UTS and
optionally network and user namespaces). It does what bubblewrap would: a tmpfs root holding only the
read-only and read-write binds the policy lists, a few device nodes, a fresh ``/proc`` and a private ``/tmp``;
``pivot_root`` into it, drop the old root, then run the worker under a small init, with no capabilities
left to undo it. Written
here because util-linux has no tool that assembles a root from a list of binds (that is bubblewrap's job).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import platform
import socket
import struct
import sys
from pathlib import Path
from typing import Any, NoReturn

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_ST_RELATIME = 4096  # statvfs's bit for relatime differs from mount's
_MNT_DETACH = 2
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECUREBITS = 28
# SECBIT_NOROOT and its lock, and KEEP_CAPS locked off: uid 0 gains no capability at execve.
_SECURE_NOROOT = 0b1 | 0b10 | 0b100000
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {source} on {target}")


def _locked_flags(path: str) -> int:
    """The flags of the mount holding ``path`` that a remount in a user namespace must keep."""
    flag = os.statvfs(path).f_flag
    flags = flag & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
    return flags | (_MS_RELATIME if flag & _ST_RELATIME else 0)


def _bind(source: str, root: str, *, writable: bool = False) -> None:
    """Bind ``source`` at the same path under ``root`` (read-only unless ``writable``); missing ones are skipped."""
    if not os.path.lexists(source):
        return
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        Path(target).touch()
    _mount(source, target, None, _MS_BIND | _MS_REC)
    if not writable:
        _mount("none", target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _locked_flags(source))


def _loopback_up() -> None:
    """A new network namespace starts with ``lo`` down; bring it up as bubblewrap does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | _IFF_UP))


def build(spec: dict[str, Any]) -> None:
    """Assemble the view described by ``spec`` (see ``policy.unshare_argv``) and pivot into it."""
    root = spec["root"]
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates back to the host
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    for target, link in spec["symlinks"]:
        os.symlink(target, root + link)
    # The private /tmp first: binds may sit under /tmp, and a later tmpfs would hide them.
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    for path in spec["read_only"]:
        _bind(path, root)
    os.makedirs(root + "/dev", mode=0o755)
    for name in _DEVICES:
        _bind(f"/dev/{name}", root, writable=True)
    os.makedirs(root + "/proc", mode=0o555)
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for path in spec["writable"]:
        _bind(path, root, writable=True)
    _mount("none", root, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir(root)
    # pivot_root(".", "."): the old root ends up on top of the new one, and is detached at once.
    _check(_libc.syscall(_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", _MNT_DETACH), "umount the old root")
    os.chdir(spec["chdir"])
    socket.sethostname("sandbox")
    if not spec["network"]:
        _loopback_up()


def _no_more_privileges(in_user_namespace: bool) -> None:
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if in_user_namespace:  # root of its own namespace: make uid 0 powerless after the exec
        _check(_libc.prctl(_PR_SET_SECUREBITS, _SECURE_NOROOT, 0, 0, 0), "securebits")


def _init(argv: list[str], env: dict[str, str]) -> NoReturn:
    """Be the namespace's init, as bubblewrap's is: run the command as a child (init ignores signals it has no
    handler for, the kernel's SIGXCPU included, so the worker must not be init), reap every orphan, and exit
    as the command did (128 + N when signal N ended it, as bubblewrap reports it)."""
    child = os.fork()
    if child == 0:
        os.execve(argv[0], argv, env)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == child:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def main(argv: list[str]) -> None:
    """Build the view, then run the command under an init (never returns)."""
    spec = json.loads(argv[0])
    build(spec)
    _no_more_privileges(spec["user_namespace"])
    _init(spec["argv"], spec["env"])


if __name__ == "__main__":
    main(sys.argv[1:])
