"""What each command family needs approval for: the checks behind ``tools.approval_rules.classify``."""

from __future__ import annotations

from tools.approval_rules._check import (
    DESTRUCTIVE_DELETE,
    GIT_FORCE_PUSH,
    GIT_REWRITE,
    NETWORK,
    OPAQUE,
    PACKAGE_INSTALL,
    PRIVILEGE_ESCALATION,
    REMOTE_CODE,
    Handler,
    Scan,
    check_argv,
    check_script,
    check_targets,
    family,
    resolve,
    show,
)
from tools.approval_rules._shell import (
    Cmd,
    Word,
    command_name,
    command_names,
    download_in,
    flag_set,
    option_values,
    options,
)


def _cd(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    """Follow the current directory, so later relative targets resolve from it."""
    operands = [word.text for word in argv[1:] if word.text == "-" or not word.text.startswith("-")]
    scan.cwd = resolve(operands[0], scan) if operands and operands[0] != "-" else None


_DELETERS = frozenset({"rm", "shred", "unlink", "rmdir", "srm", "wipe"})


def _rm(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    opts, operands = options(argv[1:], frozenset(), permute=True)
    flags, shown = flag_set(opts), show(argv)
    if flags & {"-r", "-R", "--recursive"}:
        scan.add(DESTRUCTIVE_DELETE, f"recursive delete: {shown}")
    elif flags & {"-f", "--force"}:
        scan.add(DESTRUCTIVE_DELETE, f"forced delete: {shown}")
    elif any(word.text == "*" or word.text.endswith("/*") for word in operands):
        scan.add(DESTRUCTIVE_DELETE, f"deletes every file of a directory: {shown}")
    elif any(word.dynamic and not word.quoted for word in argv[1:]):
        scan.add(DESTRUCTIVE_DELETE, f"delete with arguments computed at run time: {shown}")
    check_targets(operands, shown, scan)


def _wipe(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    scan.add(DESTRUCTIVE_DELETE, f"wipes data: {show(argv)}")


def _find(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    shown, i = show(argv), 1
    while i < len(argv):
        text = argv[i].text
        i += 1
        if text == "-delete":
            scan.add(DESTRUCTIVE_DELETE, f"find -delete: {shown}")
        elif text in ("-exec", "-execdir", "-ok", "-okdir"):
            end = next((j for j in range(i, len(argv)) if argv[j].text in (";", "+")), len(argv))
            inner, i = argv[i:end], end + 1
            if inner:
                if _DELETERS.intersection(command_names(inner)):
                    scan.add(DESTRUCTIVE_DELETE, f"find {text} deletes: {shown}")
                check_argv(inner, cmd, scan, hops + 1)
        elif text in ("-fprint", "-fprint0", "-fprintf", "-fls") and i < len(argv):
            check_targets(argv[i : i + 1], shown, scan)


_SHELL_VALUED = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})


def _shell(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    command_mode = stdin_mode = False
    i = 1
    while i < len(argv):
        text = argv[i].text
        if len(text) < 2 or text[0] not in "-+" or text == "--":
            i += text == "--"
            break
        i += 1
        if text in _SHELL_VALUED:
            i += 1
        elif text[0] == "-" and not text.startswith("--"):
            command_mode |= "c" in text
            stdin_mode |= "s" in text
            i += "o" in text or "O" in text  # -eo pipefail
    script, shown = argv[i] if i < len(argv) else None, show(argv)
    if script is not None and download_in(script) is not None:
        scan.add(REMOTE_CODE, f"runs downloaded code: {shown}")
    elif command_mode:
        if script is not None:
            check_script(script.text, scan)
    elif script is not None and script.text != "-" and not stdin_mode:
        if script.dynamic:
            scan.add(OPAQUE, f"runs a script named at run time: {shown}")
    else:
        _stdin_program(argv, cmd, scan, shell=True)


# interpreter family -> (flags whose value is code or a module, other options that take a value)
_INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "python": (frozenset({"-c", "-m"}), frozenset({"-W", "-X", "--check-hash-based-pycs"})),
    "pypy": (frozenset({"-c", "-m"}), frozenset({"-W", "-X"})),
    "perl": (frozenset({"-e", "-E"}), frozenset()),
    "ruby": (frozenset({"-e"}), frozenset({"-r", "-I", "-C", "-E"})),
    "node": (frozenset({"-e", "--eval", "-p", "--print"}), frozenset({"-r", "--require", "--import", "--loader"})),
    "nodejs": (frozenset({"-e", "--eval", "-p", "--print"}), frozenset({"-r", "--require", "--import"})),
    "php": (frozenset({"-r"}), frozenset({"-c", "-d", "-z"})),
    "lua": (frozenset({"-e"}), frozenset({"-l"})),
    "Rscript": (frozenset({"-e"}), frozenset()),
    "osascript": (frozenset({"-e"}), frozenset()),
    "tclsh": (frozenset(), frozenset()),
}


def _interpreter(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    shown = show(argv)
    if any(download_in(word) is not None for word in argv[1:]):
        scan.add(REMOTE_CODE, f"runs downloaded code: {shown}")
        return
    inline, valued = _INTERPRETERS[family(command_name(argv[0].text))]
    opts, operands = options(argv[1:], inline | valued, permute=False)
    modules = option_values(opts, ("-m",))
    if modules and modules[0] == "pip":
        _package([Word("pip"), *operands], cmd, scan, hops)
    elif flag_set(opts) & inline:
        return
    elif operands and operands[0].text != "-":
        if operands[0].dynamic:
            scan.add(OPAQUE, f"runs a script named at run time: {shown}")
    else:
        _stdin_program(argv, cmd, scan, shell=False)


def _stdin_program(argv: list[Word], cmd: Cmd, scan: Scan, *, shell: bool) -> None:
    """A shell or interpreter reading its program from stdin: from a download, a pipe, or a here-document."""
    shown = show(argv)
    if cmd.fed_by is not None:
        scan.add(REMOTE_CODE, f"download piped into an interpreter: {show(cmd.fed_by.words)} | {shown}")
        return
    feeds = [redirect for redirect in cmd.redirects if redirect.op in ("<", "<<<", "<<")]
    if any(download_in(redirect.target) is not None for redirect in feeds):
        scan.add(REMOTE_CODE, f"download fed into an interpreter: {shown}")
    elif cmd.piped or any(redirect.op == "<" and redirect.target.dynamic for redirect in feeds):
        scan.add(OPAQUE, f"runs code read from a pipe: {shown}")
    elif shell:
        for redirect in feeds:
            script = redirect.body if redirect.op == "<<" else redirect.target.text
            if redirect.op != "<" and script:
                check_script(script, scan)


def _eval(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    if len(argv) > 1:
        check_script(show(argv[1:]), scan)


def _source(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    if len(argv) < 2:
        return
    if download_in(argv[1]) is not None:
        scan.add(REMOTE_CODE, f"sources downloaded code: {show(argv)}")
    elif argv[1].dynamic:
        scan.add(OPAQUE, f"sources a file named at run time: {show(argv)}")


def _alias(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    for word in argv[1:]:
        _, eq, value = word.text.partition("=")
        if eq and value.strip():
            check_script(value, scan)


def _trap(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    operands = [word.text for word in argv[1:] if word.text != "--"]
    if len(operands) > 1 and operands[0] != "-" and not operands[0].startswith("-") and operands[0].strip():
        check_script(operands[0], scan)


def _su(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    valued = frozenset({"-c", "--command", "-s", "--shell", "-g", "--group", "-G", "--supp-group", "-u", "--user",
                        "-w", "--whitelist-environment", "--session-command"})  # fmt: skip
    opts, operands = options(argv[1:], valued, permute=command_name(argv[0].text) == "su")
    for script in option_values(opts, ("-c", "--command", "--session-command")):
        check_script(script, scan)
    if option_values(opts, ("-u", "--user")) and operands:  # runuser -u USER [--] COMMAND
        check_argv(operands, cmd, scan, hops + 1)


def _watch(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    _, operands = options(argv[1:], frozenset({"-n", "--interval", "-q", "--equexit"}), permute=False)
    if operands:
        check_script(show(operands), scan)


def _chmod(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    opts, operands = options(argv[1:], frozenset(), permute=True)
    shown = show(argv)
    if "--reference" in flag_set(opts):
        check_targets(operands, shown, scan)
        return
    if operands and _setuid(operands[0].text):
        scan.add(PRIVILEGE_ESCALATION, f"setuid/setgid chmod: {shown}")
    check_targets(operands[1:], shown, scan)


def _setuid(mode: str) -> bool:
    """Whether a chmod mode sets the setuid or setgid bit."""
    if mode.isdigit():
        return len(mode) >= 4 and set(mode) <= set("01234567") and int(mode[-4]) & 6 != 0
    operator = ""
    for ch in mode:
        if ch in "+-=,":
            operator = "" if ch == "," else ch
        elif ch == "s" and operator in ("+", "="):
            return True
    return False


def _is_root(spec: str) -> bool:
    owner, sep, group = spec.partition(":") if ":" in spec else spec.partition(".")
    return owner in ("root", "0") or (bool(sep) and group in ("root", "0"))


def _chown(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    opts, operands = options(argv[1:], frozenset(), permute=True)
    shown = show(argv)
    if "--reference" in flag_set(opts):
        check_targets(operands, shown, scan)
        return
    if operands and _is_root(operands[0].text if command_name(argv[0].text) == "chown" else ":" + operands[0].text):
        scan.add(PRIVILEGE_ESCALATION, f"gives files to root: {shown}")
    check_targets(operands[1:], shown, scan)


_COPY_VALUED = {
    "cp": frozenset({"-t", "--target-directory", "-S", "--suffix"}),
    "mv": frozenset({"-t", "--target-directory", "-S", "--suffix"}),
    "ln": frozenset({"-t", "--target-directory", "-S", "--suffix"}),
    "install": frozenset({"-t", "--target-directory", "-S", "--suffix", "-m", "--mode", "-o", "--owner", "-g",
                          "--group"}),
    "rsync": frozenset({"-e", "--rsh", "-f", "--filter", "--exclude", "--include", "--exclude-from",
                        "--include-from", "--files-from", "-T", "--temp-dir", "--backup-dir", "--log-file",
                        "--password-file", "--chmod", "--chown", "--port", "--timeout", "--bwlimit", "-B",
                        "--block-size", "-M", "--remote-option", "--link-dest", "--compare-dest", "--copy-dest",
                        "--max-size", "--min-size", "--partial-dir", "--suffix"}),
    "scp": frozenset({"-c", "-F", "-i", "-J", "-l", "-o", "-P", "-S"}),
}  # fmt: skip


def _is_remote(path: str) -> bool:
    host, colon, _ = path.partition(":")
    return path.startswith("rsync://") or (bool(colon) and bool(host) and "/" not in host)


def _copy(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    name, shown = command_name(argv[0].text), show(argv)
    opts, operands = options(argv[1:], _COPY_VALUED[name], permute=True)
    flags = flag_set(opts)
    if name in ("rsync", "scp"):
        if scan.network and (name == "scp" or any(_is_remote(word.text) for word in operands)):
            scan.add(NETWORK, f"network access: {shown}")
        if any(flag.startswith("--delete") or flag == "--remove-source-files" for flag in flags):
            scan.add(DESTRUCTIVE_DELETE, f"rsync deletes files: {shown}")
    if name == "install" and (
        any(_is_root(owner) for owner in option_values(opts, ("-o", "--owner")))
        or any(_is_root(":" + group) for group in option_values(opts, ("-g", "--group")))
        or any(_setuid(mode) for mode in option_values(opts, ("-m", "--mode")))
    ):
        scan.add(PRIVILEGE_ESCALATION, f"installs a privileged file: {shown}")
    directories = [Word(value) for value in option_values(opts, ("-t", "--target-directory"))]
    if name == "mv" or (name == "install" and flags & {"-d", "--directory"}):
        targets = operands + directories
    else:
        targets = directories or (operands[-1:] if len(operands) > 1 else [])
    check_targets([word for word in targets if not _is_remote(word.text)], shown, scan)


_TARGET_VALUED = {
    "tee": frozenset(),
    "touch": frozenset({"-d", "--date", "-t", "-r", "--reference"}),
    "mkdir": frozenset({"-m", "--mode", "--context"}),
    "truncate": frozenset({"-s", "--size", "-r", "--reference"}),
    "rmdir": frozenset(),
    "unlink": frozenset(),
}


def _operand_targets(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    _, operands = options(argv[1:], _TARGET_VALUED[command_name(argv[0].text)], permute=True)
    check_targets(operands, show(argv), scan)


def _dd(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    outputs = [Word(word.text[3:]) for word in argv[1:] if word.text.startswith("of=")]
    check_targets(outputs, show(argv), scan)


def _sed(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    scripts = ("-e", "--expression", "-f", "--file")
    opts, operands = options(argv[1:], frozenset({*scripts, "-l", "--line-length"}), permute=True)
    flags = flag_set(opts)
    if flags & {"-i", "--in-place"}:
        check_targets(operands if flags.intersection(scripts) else operands[1:], show(argv), scan)


_DOWNLOAD_VALUED = {
    "curl": frozenset({"-o", "--output", "--output-dir", "-d", "--data", "--data-raw", "--data-binary",
                       "--data-urlencode", "-H", "--header", "-u", "--user", "-X", "--request", "-A", "--user-agent",
                       "-e", "--referer", "-b", "--cookie", "-c", "--cookie-jar", "-K", "--config", "-T",
                       "--upload-file", "-F", "--form", "-w", "--write-out", "-x", "--proxy", "-r", "--range", "-m",
                       "--max-time", "--connect-timeout", "-D", "--dump-header", "--retry", "-C", "--continue-at",
                       "-E", "--cert", "--key", "--cacert", "--resolve", "--url", "-z", "--time-cond"}),
    "wget": frozenset({"-O", "--output-document", "-o", "--output-file", "-a", "--append-output", "-P",
                       "--directory-prefix", "-U", "--user-agent", "--header", "-e", "--execute", "-T", "--timeout",
                       "-t", "--tries", "-i", "--input-file", "--post-data", "--post-file", "-Q", "--quota", "-w",
                       "--wait", "--user", "--password", "-l", "--level", "-A", "--accept", "-R", "--reject", "-D",
                       "--domains", "--load-cookies", "--save-cookies"}),
}  # fmt: skip
_DOWNLOAD_WRITES = {
    "curl": ("-o", "--output", "--output-dir", "-c", "--cookie-jar", "-D", "--dump-header"),
    "wget": ("-O", "--output-document", "-o", "--output-file", "-a", "--append-output", "-P", "--directory-prefix",
             "--save-cookies"),
}  # fmt: skip


def _download(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    name, shown = command_name(argv[0].text), show(argv)
    if scan.network:
        scan.add(NETWORK, f"network access: {shown}")
    opts, _ = options(argv[1:], _DOWNLOAD_VALUED[name], permute=True)
    writes = [Word(value) for value in option_values(opts, _DOWNLOAD_WRITES[name]) if value != "-"]
    check_targets(writes, shown, scan)


def _network(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    if scan.network:
        scan.add(NETWORK, f"network access: {show(argv)}")


_GIT_VALUED = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env", "--super-prefix"})
_GIT_NETWORK = frozenset({"clone", "fetch", "pull", "push", "ls-remote", "submodule"})
_GIT_COMMAND_KEYS = frozenset({"core.sshcommand", "core.pager", "core.editor", "core.fsmonitor", "core.hookspath",
                               "sequence.editor", "diff.external", "credential.helper", "core.gitproxy"})  # fmt: skip


def _git(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    opts, rest = options(argv[1:], _GIT_VALUED, permute=False)
    shown = show(argv)
    for key in (value.partition("=")[0].lower() for value in option_values(opts, ("-c",))):
        if key.startswith("alias.") or key in _GIT_COMMAND_KEYS or key.endswith((".textconv", ".cmd", ".command")):
            scan.add(OPAQUE, f"git -c {key} runs a command the classifier cannot see: {shown}")
    if not rest:
        return
    sub, args = rest[0].text, rest[1:]
    if scan.network and (sub in _GIT_NETWORK or (sub == "remote" and args and args[0].text == "update")):
        scan.add(NETWORK, f"network access: {shown}")
    sub_opts, operands = options(args, frozenset({"-o", "--push-option", "--repo", "-b", "-B", "-m", "-C"}),
                                  permute=True)  # fmt: skip
    flags, words = flag_set(sub_opts), [word.text for word in operands]
    if sub == "push" and (
        flags & {"-f", "--force", "--force-with-lease", "--force-if-includes", "--mirror", "-d", "--delete", "--prune"}
        or any(word.startswith(("+", ":")) for word in words[1:])
    ):
        scan.add(GIT_FORCE_PUSH, f"force push: {shown}")
    elif sub == "clean" and flags & {"-f", "--force"}:
        scan.add(DESTRUCTIVE_DELETE, f"git clean deletes untracked files: {shown}")
    elif sub == "submodule" and "foreach" in words:
        script = [word for word in words[words.index("foreach") + 1 :] if not word.startswith("--")]
        if script:
            check_script(" ".join(script), scan)
    elif _git_rewrites(sub, flags, words, [word.text for word in args]):
        scan.add(GIT_REWRITE, f"rewrites history or discards work: {shown}")


def _git_rewrites(sub: str, flags: set[str], words: list[str], raw: list[str]) -> bool:
    if sub in ("filter-branch", "filter-repo"):
        return True
    if sub == "reset":
        return "--hard" in flags
    if sub == "rebase":
        return not flags & {"--abort", "--quit", "--show-current-patch"}
    if sub == "branch":
        return bool(flags & {"-D", "-M", "-C", "-f", "--force"})
    if sub == "checkout":
        return bool(flags & {"-f", "--force", "-B"}) or "." in words or "--" in raw[:-1]
    if sub == "switch":
        return bool(flags & {"-f", "--force", "--discard-changes", "-C", "--force-create"})
    if sub == "restore":
        return not flags & {"-S", "--staged"} or bool(flags & {"-W", "--worktree"})
    if sub in ("stash", "reflog"):
        return bool(words) and words[0] in ("drop", "clear", "expire", "delete")
    return sub == "update-ref" and "-d" in flags


# package manager -> subcommands ("sub" or "sub sub2") that install, upgrade or remove packages
_INSTALLS: dict[str, frozenset[str]] = {
    "pip": frozenset({"install", "uninstall"}),
    "pipx": frozenset({"install", "inject", "upgrade", "upgrade-all", "reinstall", "reinstall-all", "run"}),
    "uv": frozenset({"add", "remove", "sync", "pip install", "pip uninstall", "pip sync", "tool install",
                     "tool run", "tool upgrade"}),
    "poetry": frozenset({"add", "install", "update", "remove"}),
    "pipenv": frozenset({"install", "uninstall", "update", "sync"}),
    "pdm": frozenset({"add", "install", "update", "sync", "remove"}),
    "npm": frozenset({"install", "i", "in", "ins", "inst", "insta", "instal", "isnt", "isnta", "isntal", "isntall",
                      "add", "ci", "clean-install", "install-test", "it", "update", "up", "upgrade", "uninstall", "un",
                      "remove", "rm", "r", "exec", "x"}),
    "pnpm": frozenset({"add", "install", "i", "update", "up", "upgrade", "remove", "rm", "uninstall", "un", "dlx"}),
    "yarn": frozenset({"add", "install", "global", "up", "upgrade", "remove", "dlx"}),
    "bun": frozenset({"add", "install", "i", "update", "remove", "rm", "x"}),
    "apt": frozenset({"install", "reinstall", "remove", "purge", "autoremove", "upgrade", "full-upgrade",
                      "dist-upgrade", "build-dep"}),
    "dnf": frozenset({"install", "in", "reinstall", "remove", "erase", "rm", "update", "upgrade", "up", "distro-sync",
                      "dup", "groupinstall", "localinstall"}),
    "apk": frozenset({"add", "del", "upgrade", "fix"}),
    "brew": frozenset({"install", "reinstall", "upgrade", "uninstall", "remove", "rm", "tap"}),
    "snap": frozenset({"install", "remove", "refresh"}),
    "flatpak": frozenset({"install", "uninstall", "update"}),
    "port": frozenset({"install", "uninstall", "upgrade"}),
    "gem": frozenset({"install", "uninstall", "update"}),
    "cargo": frozenset({"install", "uninstall", "add"}),
    "go": frozenset({"install", "get"}),
    "composer": frozenset({"require", "install", "update", "remove", "global"}),
    "bundle": frozenset({"install", "update", "add"}),
    "conda": frozenset({"install", "create", "update", "upgrade", "remove", "uninstall"}),
    "dotnet": frozenset({"add package", "tool install", "tool update"}),
    "rustup": frozenset({"toolchain install", "component add", "target add", "update"}),
    "cabal": frozenset({"install"}),
    "stack": frozenset({"install"}),
    "opam": frozenset({"install", "upgrade"}),
    "luarocks": frozenset({"install"}),
    "nix": frozenset({"profile install", "profile upgrade"}),
}  # fmt: skip
_INSTALLS.update(
    {alias: _INSTALLS[same] for alias, same in (("apt-get", "apt"), ("aptitude", "apt"), ("yum", "dnf"),
     ("microdnf", "dnf"), ("tdnf", "dnf"), ("zypper", "dnf"), ("mamba", "conda"), ("micromamba", "conda"))}
)  # fmt: skip
# flag-driven package managers -> (flags that change packages, flags that make it a query)
_FLAG_INSTALLS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "pacman": (frozenset({"-S", "--sync", "-U", "--upgrade", "-R", "--remove"}),
               frozenset({"-s", "--search", "-i", "--info", "-g", "--groups", "-l", "--list", "-p", "--print", "-Q"})),
    "dpkg": (frozenset({"-i", "--install", "-r", "--remove", "-P", "--purge", "--unpack"}), frozenset()),
    "rpm": (frozenset({"-i", "--install", "-U", "--upgrade", "-F", "--freshen", "-e", "--erase"}),
            frozenset({"-q", "--query", "-V", "--verify"})),
    "nix-env": (frozenset({"-i", "--install", "-e", "--uninstall", "-u", "--upgrade"}), frozenset({"-q", "--query"})),
}  # fmt: skip
_FLAG_INSTALLS["yay"] = _FLAG_INSTALLS["paru"] = _FLAG_INSTALLS["pacman"]
_ALWAYS_INSTALLS = frozenset({"npx", "pnpx", "bunx", "uvx", "cpanm"})
_RUNNERS = frozenset({"uv", "poetry", "pipenv", "pdm", "conda", "mamba", "micromamba", "bundle"})
_RUNNER_VALUED = frozenset({"-n", "--name", "-p", "--prefix", "--python", "--with", "--from", "--project",
                            "--directory", "--package", "--env-file", "--extra", "--group"})  # fmt: skip
_PACKAGE_VALUED = frozenset({"-o", "-c", "-t", "--proxy", "--cache-dir", "--log", "--prefix", "-C", "--cwd", "--dir",
                             "--directory", "--project", "--python"})  # fmt: skip


def _package(argv: list[Word], cmd: Cmd, scan: Scan, hops: int) -> None:
    name, shown = family(command_name(argv[0].text)), show(argv)
    if name in _FLAG_INSTALLS:
        changes, queries = _FLAG_INSTALLS[name]
        flags = flag_set(options(argv[1:], frozenset(), permute=True)[0])
        installs = bool(flags & changes) and not flags & queries
    else:
        _, operands = options(argv[1:], _PACKAGE_VALUED, permute=False)
        words = [word.text for word in operands[:2]]
        if name in _RUNNERS and words[:1] in (["run"], ["exec"]):  # uv run CMD, bundle exec CMD
            inner = options(operands[1:], _RUNNER_VALUED, permute=False)[1]
            if inner:
                check_argv(inner, cmd, scan, hops + 1)
            return
        subcommands = _INSTALLS.get(name, frozenset())
        installs = name in _ALWAYS_INSTALLS or (bool(words) and (words[0] in subcommands or " ".join(words) in
                                                                  subcommands))  # fmt: skip
    if installs:
        scan.add(PACKAGE_INSTALL, f"package install: {shown}")
        if scan.network:
            scan.add(NETWORK, f"network access: {shown}")


_SHELLS = ("sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "yash", "posh", "fish", "csh", "tcsh", "rbash", "lksh")
_NETWORK_ONLY = ("nc", "ncat", "netcat", "socat", "telnet", "ftp", "lftp", "sftp", "ssh", "mosh", "ping", "ping6",
                 "dig", "nslookup", "host", "traceroute", "tracepath", "whois", "gh", "http", "https", "xh",
                 "aria2c")  # fmt: skip
HANDLERS: dict[str, Handler] = {
    "rm": _rm,
    "find": _find,
    "git": _git,
    "eval": _eval,
    "source": _source,
    ".": _source,
    "alias": _alias,
    "trap": _trap,
    "su": _su,
    "runuser": _su,
    "watch": _watch,
    "chmod": _chmod,
    "chown": _chown,
    "chgrp": _chown,
    "dd": _dd,
    "sed": _sed,
    "cd": _cd,
    "pushd": _cd,
    **dict.fromkeys(("shred", "wipe", "srm", "wipefs", "mkfs", "mke2fs"), _wipe),
    **dict.fromkeys(_SHELLS, _shell),
    **dict.fromkeys(_INTERPRETERS, _interpreter),
    **dict.fromkeys(_COPY_VALUED, _copy),
    **dict.fromkeys(_TARGET_VALUED, _operand_targets),
    **dict.fromkeys(_DOWNLOAD_VALUED, _download),
    **dict.fromkeys(_NETWORK_ONLY, _network),
    **dict.fromkeys((*_INSTALLS, *_FLAG_INSTALLS, *_ALWAYS_INSTALLS), _package),
}
