"""Shell parsing for the approval rules: shlex tokens into simple commands, and reading options and wrappers."""

from __future__ import annotations

import shlex
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import dropwhile

MAX_DEPTH = 24  # nesting of groups, substitutions and inner scripts
MAX_HOPS = 16  # wrappers around one command (sudo env nice ...)
_LEXER_COST = 32  # budget charged for each lexer started (substitutions, heredoc restarts)

_PUNCTUATION = "();<>|&\n"
_OPERATORS = ("<<<", "&>>", ";;&", "&&", "||", ";;", ";&", "|&", "<<", ">>", ">|", ">&", "<&", "&>", "<>", "<(",
              ">(", "(", ")", ";", "&", "|", "<", ">", "\n")  # fmt: skip
_QUOTING = frozenset("'\"\\")
_SEPARATORS = frozenset({";", "&", "&&", "||", "\n"})
_OP_ENDS = frozenset({")", ";;", ";&", ";;&"})
_REDIRECTS = frozenset({"<", ">", ">>", ">|", "<>", "&>", "&>>", ">&", "<&", "<<", "<<<"})
_PREFIX_KEYWORDS = frozenset({"!", "then", "else", "elif", "do"})
_COMPOUND = {"{": "}", "if": "fi", "while": "done", "until": "done", "for": "done", "select": "done"}


class Opaque(Exception):
    """The command cannot be inspected; the message says why."""


class Budget:
    """Characters the lexers and scanners may still read for one classification."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def spend(self, amount: int) -> None:
        self.left -= amount
        if self.left < 0:
            raise Opaque("too costly to inspect")


# --- tokens -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Tok:
    text: str
    op: bool = False
    quoted: bool = False  # its raw text had quotes or backslashes
    glued: bool = False  # no blank between it and the previous token
    line_end: int = -1  # for a newline operator: where the next line starts in the lexed text


class _Source:
    """The text shlex reads one character at a time; drops line continuations where the shell would."""

    __slots__ = ("budget", "eof", "lexer", "pos", "text")

    def __init__(self, text: str, pos: int, budget: Budget) -> None:
        self.text, self.pos, self.budget, self.eof = text, pos, budget, False
        self.lexer: shlex.shlex | None = None

    def read(self, size: int = 1) -> str:
        self.budget.spend(size)
        text, pos = self.text, self.pos
        while text.startswith("\\\n", pos) and self.lexer is not None and self.lexer.state not in ("'", "\\"):
            pos += 2
        chunk = text[pos : pos + size]
        self.pos = pos + len(chunk)
        self.eof = not chunk
        return chunk


class Lexer:
    """shlex tokens of one text, operators split apart, plus what shlex forgets (quoting, adjacency, line ends)."""

    def __init__(self, text: str, budget: Budget) -> None:
        self.text, self.budget = text, budget
        self._queue: deque[_Tok] = deque()
        self._restart(0)

    def _restart(self, pos: int) -> None:
        self.budget.spend(_LEXER_COST)
        self._source = _Source(self.text, pos, self.budget)
        self._shlex = shlex.shlex(self._source, posix=True, punctuation_chars=_PUNCTUATION)  # type: ignore[arg-type]
        self._shlex.whitespace, self._shlex.commenters, self._shlex.whitespace_split = " \t\r", "", True
        self._source.lexer = self._shlex
        self._end, self._pushed = pos, False
        self._queue.clear()

    def peek(self) -> _Tok | None:
        """The next token, left in place; None at the end."""
        if not self._queue:
            self._fill()
        return self._queue[0] if self._queue else None

    def next(self) -> _Tok | None:
        """The next token, consumed; None at the end."""
        tok = self.peek()
        if tok is not None:
            self._queue.popleft()
        return tok

    def read_heredocs(self, start: int, docs: list[Redirect]) -> None:
        """Read the bodies of ``docs`` from ``start`` (the line after their command) and lex on after them."""
        if start < 0:
            raise Opaque("here-document without a line end")
        pos, text = start, self.text
        for doc in docs:
            lines = []
            while pos < len(text):
                stop = text.find("\n", pos)
                stop = len(text) if stop < 0 else stop
                line, pos = text[pos:stop], stop + 1
                if (line.lstrip("\t") if doc.strip_tabs else line) == doc.target.text:
                    break
                lines.append(line)
            doc.body = "\n".join(lines)
        self.budget.spend(pos - start)
        self._restart(min(pos, len(text)))

    def _fill(self) -> None:
        try:
            raw = self._shlex.get_token()
        except ValueError as exc:
            raise Opaque(str(exc).lower()) from None
        if raw is None:
            return
        # The first character came back from shlex's one-character pushback when the previous token
        # ended on a non-blank; the last character read may be the next token's first.
        begin = self._end - 1 if self._pushed else self._end
        end = self._source.pos
        span, glued = self.text[begin:end].replace("\\\n", ""), self._pushed
        self._pushed = not self._source.eof and end > begin and self.text[end - 1] not in " \t\r"
        self._end = end
        if raw and all(ch in _PUNCTUATION for ch in raw) and not _QUOTING.intersection(span[:-1]):
            line_ends = iter(
                [i + 1 for i in range(begin, end) if self.text[i] == "\n" and self.text[i - 1 : i] != "\\"]
            )
            i = 0
            while i < len(raw):
                op = next(o for o in _OPERATORS if raw.startswith(o, i))
                line_end = next(line_ends, -1) if op == "\n" else -1
                self._queue.append(_Tok(op, op=True, glued=glued or i > 0, line_end=line_end))
                i += len(op)
        else:
            self._queue.append(_Tok(raw, quoted=bool(_QUOTING.intersection(span)), glued=glued))


class _TokenList:
    """Tokens already lexed (the inside of backquotes spanning several words)."""

    def __init__(self, toks: list[_Tok]) -> None:
        self._toks = deque(toks)

    def peek(self) -> _Tok | None:
        return self._toks[0] if self._toks else None

    def next(self) -> _Tok | None:
        return self._toks.popleft() if self._toks else None

    def read_heredocs(self, start: int, docs: list[Redirect]) -> None:
        raise Opaque("here-document inside backquotes")


# --- parse tree ---------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Word:
    """One word of a command, with the commands of the substitutions inside it."""

    text: str  # unquoted, unexpanded
    quoted: bool = False
    subs: list[Cmd] = field(default_factory=list)  # commands of its substitutions

    @property
    def dynamic(self) -> bool:
        """Whether its value is only known when it runs (a variable or a substitution)."""
        return "$" in self.text or "`" in self.text or bool(self.subs)


@dataclass(slots=True, eq=False)
class Redirect:
    """A redirection of a command: its operator and target."""

    op: str
    target: Word  # for a here-document, its delimiter
    body: str | None = None  # a here-document's text, once read
    strip_tabs: bool = False


@dataclass(slots=True, eq=False)
class Cmd:
    """One simple command."""

    words: list[Word] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    header: bool = False  # for/case header or function name: words that are not a command
    piped: bool = False  # its stdin is a pipe
    fed_by: Cmd | None = None  # a download earlier in its pipeline


def is_assignment(text: str) -> bool:
    """Whether a word is a NAME=value assignment."""
    name, eq, _ = text.partition("=")
    name = name.removesuffix("+").partition("[")[0]
    return bool(eq) and name.isascii() and name.isidentifier()


def _substitutions(text: str, budget: Budget) -> list[str]:
    """The insides of the outermost ``$( )`` and backquotes of one word."""
    budget.spend(len(text))
    found, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("$(", i):
            depth, j = 1, i + 2
            while j < n and depth:
                depth += (text[j] == "(") - (text[j] == ")")
                j += 1
            if depth:
                raise Opaque("unterminated $(")
            found.append(text[i + 2 : j - 1])
            i = j
        elif text[i] == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise Opaque("unterminated backquote")
            found.append(text[i + 1 : j])
            i = j + 1
        else:
            i += 1
    return [inner for inner in found if inner.strip()]


class Parser:
    """Recursive descent over tokens into simple commands (appended to ``out`` in order of appearance)."""

    def __init__(self, stream: Lexer | _TokenList, out: list[Cmd], budget: Budget, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise Opaque("nested too deeply")
        self.stream, self.out, self.budget, self.depth = stream, out, budget, depth
        self.heredocs: list[Redirect] = []

    def peek(self) -> _Tok | None:
        return self.stream.peek()

    def take(self) -> _Tok | None:
        """Consume a token; a newline after ``<<`` operators reads their here-documents first."""
        tok = self.stream.next()
        if tok is not None and tok.op and tok.text == "\n" and self.heredocs:
            docs, self.heredocs = self.heredocs, []
            self.stream.read_heredocs(tok.line_end, docs)
            for doc in docs:
                if not doc.target.quoted and doc.body:
                    for inner in _substitutions(doc.body, self.budget):
                        doc.target.subs += self.parse_text(inner)
        return tok

    def parse_text(self, text: str) -> list[Cmd]:
        """Parse a substitution's text one level deeper; its commands join ``out`` and are returned."""
        return self._sub_parse(Lexer(text, self.budget))

    def _sub_parse(self, stream: Lexer | _TokenList) -> list[Cmd]:
        first = len(self.out)
        Parser(stream, self.out, self.budget, self.depth + 1).parse_list(frozenset())
        return self.out[first:]

    def nested(self, ends: frozenset[str]) -> str | None:
        """A command list one level deeper, up to one of ``ends``."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Opaque("nested too deeply")
        try:
            return self.parse_list(ends)
        finally:
            self.depth -= 1

    def nested_commands(self) -> list[Cmd]:
        """The commands of a nested list closed by ``)``: $( ), <( ), >( )."""
        first = len(self.out)
        self.nested(frozenset({")"}))
        return self.out[first:]

    def parse_list(self, ends: frozenset[str]) -> str | None:
        """Pipelines up to one of ``ends`` (consumed and returned) or the end of input."""
        while (tok := self.peek()) is not None:
            if tok.text in ends and tok.op == (tok.text in _OP_ENDS):
                self.take()
                return tok.text
            if tok.op and tok.text in _SEPARATORS:
                self.take()
                if tok.text in ("&&", "||"):
                    while (nxt := self.peek()) is not None and nxt.op and nxt.text == "\n":
                        self.take()
                    if nxt is None or (nxt.op and nxt.text in _SEPARATORS | _OP_ENDS):
                        raise Opaque(f"a command is missing after {tok.text!r}")
                continue
            self.parse_pipeline()
        if ends:
            raise Opaque(f"missing {' or '.join(sorted(ends))!r}")
        return None

    def parse_pipeline(self) -> None:
        """Stages joined by ``|``: later stages are marked piped, and fed by the first download before them."""
        feeder: Cmd | None = None
        piped = False
        while True:
            first = len(self.out)
            self.parse_stage()
            stage = self.out[first:]
            if piped:
                for cmd in stage:
                    cmd.piped, cmd.fed_by = True, cmd.fed_by or feeder
            feeder = feeder or next((cmd for cmd in stage if downloads(cmd)), None)
            tok = self.peek()
            if tok is None or not tok.op or tok.text not in ("|", "|&"):
                return
            self.take()
            piped = True
            while (tok := self.peek()) is not None and tok.op and tok.text == "\n":
                self.take()

    def parse_stage(self) -> None:
        """One pipeline stage: a subshell, a compound command or a simple command."""
        while True:
            tok = self.peek()
            if tok is None:
                raise Opaque("a command is missing after an operator")
            if tok.op:
                if tok.text == "(":
                    self.take()
                    self.nested(frozenset({")"}))
                    self.parse_redirects()
                elif tok.text in _REDIRECTS:
                    self.parse_simple()
                else:
                    raise Opaque(f"unexpected {tok.text!r}")
                return
            if tok.text in _PREFIX_KEYWORDS:
                self.take()
                continue
            if tok.text == "function":
                self.take()
                if (name := self.peek()) is not None and not name.op:
                    self.take()
                continue
            if tok.text == "case":
                self.take()
                self.parse_simple(header=True, stop="in")
                self.parse_case()
            elif tok.text in _COMPOUND:
                self.take()
                if tok.text in ("for", "select"):
                    self.parse_simple(header=True)
                self.nested(frozenset({_COMPOUND[tok.text]}))
            else:
                self.parse_simple()
                return
            self.parse_redirects()
            return

    def parse_case(self) -> None:
        """The ``pattern) commands ;;`` items of a case, up to ``esac``."""
        while True:
            while (tok := self.peek()) is not None and tok.op and tok.text in _SEPARATORS:
                self.take()
            tok = self.take()
            if tok is None:
                raise Opaque("missing 'esac'")
            if not tok.op and tok.text == "esac":
                return
            while tok is not None and not (tok.op and tok.text == ")"):  # the pattern
                tok = self.take()
            if tok is None or self.nested(frozenset({";;", ";&", ";;&", "esac"})) == "esac":
                return

    def parse_redirects(self) -> None:
        """Redirections after a compound command apply to all of it: keep them on a command of their own."""
        cmd: Cmd | None = None
        while (tok := self.peek()) is not None and tok.op and tok.text in _REDIRECTS:
            if cmd is None:
                cmd = Cmd()
                self.out.append(cmd)
            self.take()
            self.redirect(cmd, tok)

    def parse_simple(self, *, header: bool = False, stop: str | None = None) -> None:
        """Words and redirections up to an operator (or the word ``stop``), as one command."""
        cmd = Cmd(header=header)
        self.out.append(cmd)
        last: Word | None = None  # the word just read, while nothing else has followed it
        while (tok := self.peek()) is not None:
            if not tok.op:
                self.take()
                if stop is not None and tok.text == stop:
                    return
                last = self.word(tok)
                if cmd.words or header or not is_assignment(last.text):
                    cmd.words.append(last)
                continue
            if tok.text in _REDIRECTS:
                self.take()
                if last is not None and tok.glued and last.text.isdigit() and cmd.words and cmd.words[-1] is last:
                    cmd.words.pop()  # a file descriptor number: 2>file
                self.redirect(cmd, tok)
            elif tok.text in ("<(", ">("):
                self.take()
                cmd.words.append(self.process_substitution(tok))
            elif tok.text == "(" and last is not None and tok.glued and last.text.endswith("$"):
                self.take()
                last.text += "(...)"
                last.subs += self.nested_commands()
            elif tok.text == "(" and header and not cmd.words:  # for (( ...; ...; ... ))
                self.take()
                self.nested_commands()
            elif tok.text == "(" and len(cmd.words) == 1:  # a function definition: name ( )
                self.take()
                closing = self.take()
                if closing is None or closing.text != ")":
                    raise Opaque("unexpected '('")
                cmd.header = True
                return
            else:
                return
            last = None

    def process_substitution(self, op: _Tok) -> Word:
        """The word a ``<( )`` or ``>( )`` stands for, carrying its commands."""
        return Word(op.text + "...)", subs=self.nested_commands())

    def redirect(self, cmd: Cmd, op: _Tok) -> None:
        """The target of redirection ``op``; a ``<<`` delimiter queues a here-document for the line's end."""
        target = self.take()
        if target is not None and target.op and target.text in ("<(", ">("):  # sh < <(curl ...)
            cmd.redirects.append(Redirect(op.text, self.process_substitution(target)))
            return
        if target is None or target.op:
            raise Opaque(f"{op.text} without a target")
        if op.text != "<<":
            cmd.redirects.append(Redirect(op.text, self.word(target)))
            return
        strip_tabs = target.glued and target.text.startswith("-")  # <<-EOF
        delimiter = target.text[1:] if strip_tabs else target.text
        if strip_tabs and not delimiter:  # <<- EOF
            target = self.take()
            if target is None or target.op:
                raise Opaque("<<- without a delimiter")
            delimiter = target.text
        doc = Redirect("<<", Word(delimiter, quoted=target.quoted), strip_tabs=strip_tabs)
        cmd.redirects.append(doc)
        self.heredocs.append(doc)

    def word(self, tok: _Tok) -> Word:
        """A word token with its substitutions parsed (a backquote may run on over the next tokens)."""
        text, tail, inner = tok.text, "", []
        if text.count("`") % 2:  # a backquote left open: its command runs on over the next tokens
            text, _, first = text.rpartition("`")
            toks = [_Tok(first, quoted=tok.quoted)] if first else []
            while True:
                nxt = self.take()
                if nxt is None:
                    raise Opaque("unterminated backquote")
                if not nxt.op and "`" in nxt.text:
                    last, _, tail = nxt.text.partition("`")
                    toks += [_Tok(last, quoted=nxt.quoted)] if last else []
                    break
                toks.append(nxt)
            inner = self._sub_parse(_TokenList(toks))
        word = Word(text + ("$(...)" if inner else "") + tail, quoted=tok.quoted, subs=inner)
        for part in (text, tail):
            if "$(" in part or "`" in part:
                for sub in _substitutions(part, self.budget):
                    word.subs += self.parse_text(sub)
        return word


def command_name(text: str) -> str:
    """The basename a command word runs: /bin/rm -> rm."""
    return text.rsplit("/", 1)[-1]


# --- options ------------------------------------------------------------------------------------

Options = list[tuple[str, str | None]]


def options(args: Sequence[Word], valued: frozenset[str], *, permute: bool) -> tuple[Options, list[Word]]:
    """GNU-style options of ``args`` as (flag, value) pairs, short clusters split, and the operands.

    Without ``permute`` everything from the first operand on is an operand (wrappers, subcommands).
    """
    opts: Options = []
    operands: list[Word] = []
    i = 0
    while i < len(args):
        text = args[i].text
        i += 1
        if text == "--":
            operands += args[i:]
            break
        if len(text) < 2 or not text.startswith("-"):
            if not permute:
                operands += args[i - 1 :]
                break
            operands.append(args[i - 1])
            continue
        if text.startswith("--"):
            flag, eq, value = text.partition("=")
            if not eq and flag in valued and i < len(args):
                value, eq, i = args[i].text, "=", i + 1
            opts.append((flag, value if eq else None))
            continue
        for k in range(1, len(text)):
            flag = "-" + text[k]
            if flag in valued:
                value = text[k + 1 :]
                if not value and i < len(args):
                    value, i = args[i].text, i + 1
                opts.append((flag, value))
                break
            opts.append((flag, None))
    return opts, operands


def flag_set(opts: Options) -> set[str]:
    """The flags given, without their values."""
    return {flag for flag, _ in opts}


def option_values(opts: Options, names: Sequence[str]) -> list[str]:
    """The non-empty values given to any of the options ``names``."""
    return [value for flag, value in opts if flag in names and value]


@dataclass(frozen=True, slots=True)
class _Wrapper:
    """A command that runs the command after its options (sudo, env, nice, timeout ...)."""

    valued: frozenset[str] = frozenset()  # options that take a value
    positional: int = 0  # operands before the command (timeout's duration, chroot's directory)
    assignments: bool = False  # NAME=value words before the command (env)
    lookup: frozenset[str] = frozenset()  # options meaning "only look the command up" (command -v)
    scripts: frozenset[str] = frozenset()  # options whose value is a shell command (env -S, flock -c)


def unwrap(spec: _Wrapper, args: Sequence[Word]) -> tuple[list[Word], list[str]]:
    """The wrapped command's words (empty when none runs) and the shell scripts given as option values."""
    opts, rest = options(args, spec.valued | spec.scripts, permute=False)
    scripts = option_values(opts, tuple(spec.scripts))
    if flag_set(opts) & spec.lookup:
        return [], scripts
    if spec.assignments:
        rest = list(dropwhile(lambda word: is_assignment(word.text), rest))
    if spec.positional:  # options may follow the positional operands too: flock FILE -c CMD
        opts, rest = options(rest[spec.positional :], spec.valued | spec.scripts, permute=False)
        scripts += option_values(opts, tuple(spec.scripts))
    return rest, scripts


def _w(
    *valued: str,
    positional: int = 0,
    assignments: bool = False,
    lookup: frozenset[str] = frozenset(),
    scripts: frozenset[str] = frozenset(),
) -> _Wrapper:
    return _Wrapper(frozenset(valued), positional, assignments, lookup, scripts)


WRAPPERS: dict[str, _Wrapper] = {
    "sudo": _w("-u", "--user", "-g", "--group", "-C", "--close-from", "-D", "--chdir", "-h", "--host", "-p",
               "--prompt", "-r", "--role", "-t", "--type", "-T", "--command-timeout", "-U", "--other-user"),
    "doas": _w("-u", "-C"),
    "pkexec": _w("--user"),
    "run0": _w("-u", "--user", "-g", "--group", "-D", "--chdir", "--setenv", "--unit", "--property", "--nice"),
    "env": _w("-u", "--unset", "-C", "--chdir", assignments=True, scripts=frozenset({"-S", "--split-string"})),
    "command": _w(lookup=frozenset({"-v", "-V"})),
    "builtin": _w(),
    "exec": _w("-a"),
    "nice": _w("-n", "--adjustment"),
    "nohup": _w(),
    "setsid": _w(),
    "time": _w("-f", "--format", "-o", "--output"),
    "stdbuf": _w("-i", "-o", "-e", "--input", "--output", "--error"),
    "ionice": _w("-c", "--class", "-n", "--classdata", "-p", "--pid", "-P", "--pgid", "-u", "--uid"),
    "timeout": _w("-s", "--signal", "-k", "--kill-after", positional=1),
    "chroot": _w("--userspec", "--groups", positional=1),
    "taskset": _w(positional=1),
    "flock": _w("-w", "--wait", "--timeout", "-E", "--conflict-exit-code", positional=1,
                scripts=frozenset({"-c", "--command"})),
    "xargs": _w("-a", "--arg-file", "-d", "--delimiter", "-E", "-I", "-L", "-n", "--max-args", "-P", "--max-procs",
                "-s", "--max-chars", "--process-slot-var"),
    "busybox": _w(),
    "toybox": _w(),
}  # fmt: skip
_FETCHERS = frozenset({"curl", "wget", "fetch", "http", "https", "xh", "nc", "ncat", "netcat", "socat", "ssh"})


def command_names(words: list[Word]) -> Iterator[str]:
    """The names of a command and of the commands its wrappers run."""
    for _ in range(MAX_HOPS):
        if not words or words[0].dynamic:
            return
        name = command_name(words[0].text)
        yield name
        spec = WRAPPERS.get(name)
        if spec is None:
            return
        words = unwrap(spec, words[1:])[0]


def downloads(cmd: Cmd) -> bool:
    """Whether a command (or the command its wrappers run) prints something fetched from the network."""
    return not cmd.header and any(name in _FETCHERS for name in command_names(cmd.words))


def download_in(word: Word) -> Cmd | None:
    """The first download among the commands of a word's substitutions."""
    return next((cmd for cmd in word.subs if downloads(cmd)), None)
