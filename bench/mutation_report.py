"""``make mutate``: mutation testing (mutmut) of the modules that carry the gateway's guarantees, and its report.

Each module is tried against its own tests (``SCOPE``): mutmut maps every function to the tests that call
it, and this script keeps only the module's test files in that map, so a mutant of ``gateway/auth.py``
is judged by ``tests/gateway/test_auth.py`` and not by every end-to-end test that happens to authorize a
message (which would also make each survivor cost minutes). Three steps:

1. ``mutmut run`` on a handful of mutants: copies the tree to ``mutants/``, writes every mutant, runs
   the tests once to map functions to tests (``mutants/mutmut-stats.json``);
2. that map cut down to each module's test files;
3. ``mutmut run`` on every mutant in ``SCOPE``, then this report: the kill rate per module and every mutant
   that was not killed, with its line and diff, classified by ``bench/mutation_triage.toml`` (equivalent,
   or a gap in the tests and the test that would close it). The report goes to
   ``bench/results/mutation.json`` and a section of ``bench/RESULTS.md``.

mutmut imports the mutated copy; subprocesses of the tests must too. ``.venv-mutate`` is a copy of
``.venv`` whose editable install points at ``mutants/`` (so ``python -I`` sandbox workers and probes
import the copy), and ``bench/mutation_plugin.py`` hands the active mutant to sandbox workers.

``python -m bench.mutation_report --modules gateway/auth.py`` runs one module (``mutants/`` and its test map
are kept between runs; ``--fresh`` starts over), and the report keeps the other modules' results from the last
one, so that modules run one at a time add up; ``--report-only`` rebuilds the report from ``mutants/`` without
running anything.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
MUTATE_VENV = ROOT / ".venv-mutate"
TRIAGE = ROOT / "bench" / "mutation_triage.toml"
RESULTS_JSON = ROOT / "bench" / "results" / "mutation.json"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
SECTION = "## Mutation testing (`make mutate`)"
MUTMUT = "import sys; from mutmut.__main__ import cli; sys.exit(cli())"


@dataclass(frozen=True)
class Scope:
    """A module under mutation: the tests that judge it, and which of its functions (mutmut's names)."""

    tests: tuple[str, ...]
    functions: tuple[str, ...] = ("*",)
    note: str = ""


# The modules that carry the README's guarantees. Where only some functions are mutated, ``note`` says why
# (the whole run has to fit in about an hour on two cores; the sandbox's tests start real workers).
SCOPE: dict[str, Scope] = {
    "gateway/auth.py": Scope(("tests/gateway/test_auth.py",)),
    "gateway/pairing.py": Scope(("tests/gateway/test_auth.py", "tests/gateway/test_pairing_mutants.py")),
    "platforms/webhook_signatures.py": Scope(("tests/platforms/test_webhook_signatures.py",
                                              "tests/platforms/test_webhook_signatures_mutants.py")),
    "gateway/store.py": Scope(
        ("tests/gateway/test_store.py", "tests/gateway/test_outbox.py", "tests/gateway/test_store_mutants.py"),
        ("x_accept_event", "xǁStoreǁstart_run", "xǁStoreǁfinish_run", "x__finish_run", "x__store_parts",
         "x__outbox_values", "xǁStoreǁenqueue", "xǁStoreǁpending_outbox", "xǁStoreǁclaim_outbox",
         "xǁStoreǁexpire_claims", "xǁStoreǁabandon_claims", "xǁStoreǁmark_sent", "xǁStoreǁmark_retry",
         "xǁStoreǁmark_failed", "xǁStoreǁnext_run_event", "xǁStoreǁunfinished_inbox",
         "xǁStoreǁgive_back_attempt", "xǁStoreǁgive_up_run"),
        "accept, runs' start and finish, and the outbox's enqueue, claim, expiry and marks; not the schema "
        "migrations, row mapping, history or the tools' and platforms' key-value state"),
    "gateway/outbox.py": Scope(("tests/gateway/test_outbox.py", "tests/gateway/test_outbox_mutants.py")),
    "gateway/session.py": Scope(("tests/gateway/test_sessions.py", "tests/gateway/test_session_mutants.py")),
    "gateway/cron_store.py": Scope(
        ("tests/gateway/test_cron.py", "tests/gateway/test_cron_store_mutants.py"),
        ("xǁCronStoreǁadvance", "xǁCronStoreǁrecord_run", "xǁCronStoreǁfire_claimed", "xǁCronStoreǁ_update",
         "xǁCronStoreǁpause", "xǁCronStoreǁresume", "x_resume_time", "xǁCronStoreǁrequest_run",
         "xǁCronStoreǁclear_run_request", "xǁCronStoreǁdelete", "xǁCronStoreǁcount_owned"),
        "the compare-and-set writes (advance, record, claim, pause/resume, run requests, delete); not the "
        "row mapping or reads"),
    "gateway/cron.py": Scope(
        ("tests/gateway/test_cron.py", "tests/gateway/test_cron_mutants.py"),
        ("x_plan_fire", "x_fire_event_id", "xǁCronServiceǁ_claim", "xǁCronServiceǁ_fire",
         "xǁCronServiceǁrun_finished", "xǁCronServiceǁshould_deliver", "xǁCronServiceǁ_catch_up",
         "xǁCronServiceǁ_schedule", "xǁCronServiceǁ_delete_finished", "xǁCronServiceǁ_run_requested"),
        "the scheduler's decisions (when to fire, catch-up, claim, deliver, repeat); not job validation, "
        "the CRUD surface or start/stop"),
    "tools/workspace.py": Scope(("tests/tools/test_workspace.py", "tests/tools/test_file_tools.py",
                                 "tests/tools/test_workspace_mutants.py")),
    "tools/url_safety.py": Scope(("tests/tools/test_url_safety.py", "tests/tools/test_web_tools.py",
                                   "tests/tools/test_url_safety_mutants.py")),
    "gateway/logs.py": Scope(
        ("tests/gateway/test_logs.py", "tests/gateway/test_redaction_e2e.py", "tests/gateway/test_logs_mutants.py"),
        ("xǁRedactorǁ*", "xǁ_Formǁ*", "x__forms", "x__base64_forms", "x__url_atoms", "x__compile", "x__batches",
         "x__re2", "x__is_unicode", "x__any_case", "x__literal", "xǁ_RedactingFormatterǁformat",
         "xǁ_JsonFormatterǁformat"),
        "redaction; not setup_logging"),
    "tools/registry.py": Scope(
        ("tests/tools/test_registry.py", "tests/test_model_tools.py", "tests/tools/test_registry_mutants.py"),
        ("xǁToolRegistryǁregister", "xǁToolRegistryǁderegister", "xǁToolRegistryǁderegister_toolset",
         "xǁToolRegistryǁdispatch", "xǁToolRegistryǁrun_here", "xǁToolRegistryǁ_check_fn_cached",
         "xǁToolRegistryǁunavailable_reason", "xǁToolRegistryǁis_available", "xǁToolRegistryǁavailable",
         "xǁToolRegistryǁget_definitions", "xǁToolEntryǁ__init__", "x_tool_error", "x_tool_result",
         "x_truncate_result", "x_sanitize_error_text"),
        "registration and override rules, availability, dispatch and error hygiene; not discovery"),
    "tools/sandbox/pool.py": Scope(
        ("tests/tools/test_sandbox.py", "tests/tools/test_sandbox_mutants.py"),
        ("xǁSandboxPoolǁ_timeout_for", "x_exit_text", "xǁ_Workerǁkill"),
        "the limits: a call's deadline, how a worker's end is reported, killing its process group; not "
        "start-up, waiting, the pool's size or bookkeeping (each of their mutants costs a minute of real workers)"),
    "tools/sandbox/worker.py": Scope(
        ("tests/tools/test_sandbox.py", "tests/tools/test_sandbox_mutants.py"),
        ("x__set_limits", "x__limit_cpu", "x_drop_privileges"),
        "the limits: rlimits, the per-call CPU budget, dropping root; not the frame loop or the cleaning between "
        "calls"),
}
def module_of(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def function_of(mutant: str) -> str:
    """``gateway.auth.xǁAuthorizerǁcheck__mutmut_3`` -> ``xǁAuthorizerǁcheck``."""
    return mutant.partition("__mutmut_")[0].rpartition(".")[2]


# -- the mutation virtualenv ---------------------------------------------------------------------------------

# Loaded at start-up by every interpreter of .venv-mutate (a .pth file): while mutmut maps tests to functions
# (MUTANT_UNDER_TEST=stats), a process the test started (a gateway, the CLI) appends each function it runs to
# a file that bench/mutation_plugin.py reads when the test ends: one line per function, written at once, so
# a gateway killed with SIGKILL has reported what it ran.
_HITS_HOOK = """\
import os

_DIR = os.environ.get("HERMES_MUTMUT_HITS")
if _DIR and os.environ.get("MUTANT_UNDER_TEST") == "stats":
    import mutmut.stats

    _seen = set()

    def _record(name, caller=None):
        if name not in _seen:
            _seen.add(name)
            with open(os.path.join(_DIR, f"{os.getpid()}.hits"), "a") as out:
                out.write(name + "\\n")

    mutmut.stats.record_trampoline_hit = _record
"""


def mutation_venv(venv: Path) -> Path:
    """``.venv-mutate``: a copy of ``venv`` whose editable install maps the packages to ``mutants/``."""
    stamp = MUTATE_VENV / ".copied"
    source_stamp = venv / ".installed"
    # the venv and what is installed in it (a package added with pip since leaves .installed as it was)
    identity = "\n".join([str(venv.resolve()), *sorted(p.name for p in venv.glob("lib/python*/site-packages/*"))])
    fresh = stamp.exists() and stamp.read_text() == identity and (
        not source_stamp.exists() or stamp.stat().st_mtime >= source_stamp.stat().st_mtime)
    if not fresh:
        shutil.rmtree(MUTATE_VENV, ignore_errors=True)
        shutil.copytree(venv, MUTATE_VENV, symlinks=True)
        finders = list(MUTATE_VENV.glob("lib/python*/site-packages/__editable__*finder.py"))
        if not finders:
            raise SystemExit(f"{venv} has no editable install of the project (run make test once)")
        for finder in finders:
            text = finder.read_text(encoding="utf-8")
            mapping = re.search(r"^MAPPING\b.*= (\{.*\})$", text, re.M)
            if mapping is None:
                raise SystemExit(f"{finder}: no MAPPING of the editable install")
            packages = ast.literal_eval(mapping.group(1))
            moved = {name: str(MUTANTS / Path(where).name) for name, where in packages.items()}
            finder.write_text(text.replace(mapping.group(1), repr(moved)), encoding="utf-8")
        stamp.write_text(identity)
    for site in MUTATE_VENV.glob("lib/python*/site-packages"):
        (site / "_hermes_mutmut_hits.py").write_text(_HITS_HOOK, encoding="utf-8")
        (site / "_hermes_mutmut_hits.pth").write_text("import _hermes_mutmut_hits\n", encoding="utf-8")
    return MUTATE_VENV / "bin" / "python"


# -- running mutmut -------------------------------------------------------------------------------------------

def check_config(modules: list[str]) -> None:
    """pyproject's [tool.mutmut] must mutate and collect what SCOPE names (mutmut reads only that file)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    missing = [m for m in modules if m not in config["only_mutate"]]
    selected = set(config["pytest_add_cli_args_test_selection"])
    missing += [t for m in modules for t in SCOPE[m].tests if t not in selected]
    if missing:
        raise SystemExit(f"pyproject.toml [tool.mutmut] lacks: {', '.join(sorted(set(missing)))}")
    absent = [t for m in modules for t in SCOPE[m].tests if not (ROOT / t).exists()]
    if absent:
        raise SystemExit(f"test files named in SCOPE do not exist: {', '.join(absent)}")


def mutmut(python: Path, *args: str) -> int:
    print(f"$ mutmut {' '.join(args)}", flush=True)
    return subprocess.call([str(python), "-c", MUTMUT, *args], cwd=ROOT)


def in_scope(mutant: str, scope: Scope) -> bool:
    return any(fnmatch.fnmatchcase(function_of(mutant), pattern) for pattern in scope.functions)


def meta_keys(path: str) -> list[str]:
    meta = MUTANTS / f"{path}.meta"
    return list(json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]) if meta.exists() else []


def run_patterns(modules: list[str]) -> list[str]:
    """mutmut's name patterns for the mutants in scope: one per function (``*`` after its name so that the
    clean test run before the mutants also finds the function's tests), exact names where that would catch
    another function whose name starts the same way."""
    patterns: list[str] = []
    for path in modules:
        module, scope = module_of(path), SCOPE[path]
        functions = sorted({function_of(k) for k in meta_keys(path)})
        for function in functions:
            if not any(fnmatch.fnmatchcase(function, p) for p in scope.functions):
                continue
            clash = [f for f in functions if f != function and f.startswith(function)]
            patterns.append(f"{module}.{function}__mutmut_*" if clash else f"{module}.{function}*")
    return patterns


def narrow_test_map(modules: list[str]) -> None:
    """Keep, for each function of a module in SCOPE, only the tests of that module's test files."""
    stats_path = MUTANTS / "mutmut-stats.json"
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    allowed = {module_of(path): set(SCOPE[path].tests) for path in modules}
    tests_by_function = stats["tests_by_mangled_function_name"]
    for function, tests in tests_by_function.items():
        module = function.rpartition(".")[0]
        if module in allowed:
            tests_by_function[function] = [t for t in tests if t.partition("::")[0] in allowed[module]]
    stats_path.write_text(json.dumps(stats, indent=1), encoding="utf-8")


def map_tests(python: Path, modules: list[str], log: Path) -> None:
    """mutmut's mutants and function -> tests map (for the tests it has not mapped yet), cut down to SCOPE.
    mutmut has no command that stops there, so it is asked for a mutant that does not exist (numbers start at
    1): it stops right after the map."""
    with log.open("w") as out:
        print(f"$ mutmut run {module_of(modules[0])}.*__mutmut_0  (mutants and the test map; log: {log})",
              flush=True)
        subprocess.call([str(python), "-c", MUTMUT, "run", f"{module_of(modules[0])}.*__mutmut_0"],
                        cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if not (MUTANTS / "mutmut-stats.json").exists() or "Traceback" not in log.read_text(errors="replace"):
        sys.stdout.write(log.read_text(encoding="utf-8", errors="replace")[-4000:])
        raise SystemExit("mutmut did not map the tests to functions (its output is above)")
    narrow_test_map(modules)


def run(modules: list[str], max_children: int, venv: Path, *, fresh: bool) -> None:
    """Every mutant in scope of ``modules`` judged afresh (mutmut re-runs the mutants named on its command line).
    ``mutants/`` is kept between runs unless ``fresh``, so that a run of one module reuses the test map an
    earlier run made (mapping runs every test file once, longer than most modules' mutants)."""
    check_config(modules)
    python = mutation_venv(venv)
    if fresh:
        shutil.rmtree(MUTANTS, ignore_errors=True)
    MUTANTS.mkdir(exist_ok=True)
    map_tests(python, modules, MUTANTS / "step1.log")
    status = mutmut(python, "run", "--max-children", str(max_children), *run_patterns(modules))
    if status:
        raise SystemExit(f"mutmut run exited with {status}")


def rerun_survivors(modules: list[str], max_children: int, venv: Path) -> int:
    """Try the last run's survivors again, with tests added since to the test files it already used (a new
    test file changes mutmut's configuration, which makes it start over: run without --rerun then)."""
    from mutmut.stats import status_by_exit_code

    check_config(modules)
    python = mutation_venv(venv)
    if not (MUTANTS / "mutmut-stats.json").exists():
        raise SystemExit("no earlier run in mutants/ to rerun")
    map_tests(python, modules, MUTANTS / "rerun.log")
    names = [name for path in modules if (MUTANTS / f"{path}.meta").exists()
             for name, code in json.loads((MUTANTS / f"{path}.meta").read_text(encoding="utf-8"))[
                 "exit_code_by_key"].items()
             if in_scope(name, SCOPE[path]) and status_by_exit_code[code] not in KILLED | {"not checked", "skipped"}]
    if not names:
        return 0
    status = mutmut(python, "run", "--max-children", str(max_children), *names)
    if status:
        raise SystemExit(f"mutmut run exited with {status}")
    return len(names)


# -- the report -----------------------------------------------------------------------------------------------

KILLED = {"killed", "timeout", "segfault"}  # the tests failed, hung past their time, or the run was killed


@dataclass
class Survivor:
    name: str
    file: str
    function: str
    line: int | None
    status: str
    diff: str
    minus: list[str] = field(default_factory=list)
    plus: list[str] = field(default_factory=list)
    triage: dict[str, str] = field(default_factory=dict)


def function_span(path: str, function: str) -> tuple[int, int] | None:
    """First and last line (decorators included) of mutmut's ``function`` (``xǁClassǁname`` or ``x_name``)."""
    if "ǁ" in function:
        _, owner, name = function.split("ǁ")
    else:
        owner, name = None, function.removeprefix("x_")
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    bodies = [(None, tree.body)] + [(n.name, n.body) for n in tree.body if isinstance(n, ast.ClassDef)]
    for cls, body in bodies:
        for node in body:
            if cls == owner and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                return first, node.end_lineno or node.lineno
    return None


def locate(path: str, function: str, diff: str) -> int | None:
    """The source line of the mutation: the changed line inside the function, nearest the diff's hunk."""
    span = function_span(path, function)
    changed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    if span is None or not changed:
        return span[0] if span else None
    hunk = re.search(r"^@@ -(\d+)", diff, re.M)
    offset = int(hunk.group(1)) if hunk else 1
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    target = changed[0].strip()
    hits = [n for n in range(span[0], span[1] + 1) if lines[n - 1].strip() == target]
    if not hits:
        return span[0]
    return min(hits, key=lambda n: abs(n - (span[0] + offset)))


def load_triage() -> list[dict[str, Any]]:
    if not TRIAGE.exists():
        return []
    return tomllib.loads(TRIAGE.read_text(encoding="utf-8")).get("mutant", [])


def normalize(lines: list[str]) -> list[str]:
    return [" ".join(line.split()) for line in lines]


def match_triage(survivor: Survivor, entries: list[dict[str, Any]]) -> dict[str, str]:
    """The triage of this mutant. An entry names a ``file``, a ``function`` (fnmatch, default every one), and
    optionally the removed lines (``minus``), the added ones (``plus``), text they contain (``minus_has``,
    ``plus_has``), or ``wording = true`` (only a string literal's text changed: mutmut's ``"XX..XX"`` and case
    mutations). Lines, not mutmut's numbers, which
    change whenever a function does. The most specific entry wins; without one, a raise statement's message
    (its text, or None for it) is immaterial by rule."""
    def specificity(entry: dict[str, Any]) -> int:
        return (16 * ("plus" in entry) + 8 * ("minus" in entry) + 4 * ("plus_has" in entry)
                + 2 * ("minus_has" in entry) + bool(entry.get("wording")))

    wording = _only_wording(survivor)
    for entry in sorted(entries, key=specificity, reverse=True):
        if _matches(entry, survivor, wording):
            return {k: str(v) for k, v in entry.items() if k in ("class", "why", "test")}
    raising = len(survivor.minus) == 1 and survivor.minus[0].strip().startswith("raise ")
    if raising and (wording or _message_dropped(survivor)):
        return {"class": "immaterial", "why": "an exception's message (by rule: only the text of the message "
                                              "in a raise statement changed, or None took its place)"}
    return {}


def _matches(entry: dict[str, Any], survivor: Survivor, wording: bool) -> bool:
    """Whether a triage entry describes this survivor (``wording``: only a string literal's text changed)."""
    if entry.get("file") != survivor.file or not fnmatch.fnmatchcase(survivor.function, entry.get("function", "*")):
        return False
    if "minus" in entry and normalize(entry["minus"]) != normalize(survivor.minus):
        return False
    if "plus" in entry and normalize(entry["plus"]) != normalize(survivor.plus):
        return False
    if "minus_has" in entry and " ".join(entry["minus_has"].split()) not in " ".join(normalize(survivor.minus)):
        return False
    if "plus_has" in entry and " ".join(entry["plus_has"].split()) not in " ".join(normalize(survivor.plus)):
        return False
    return not entry.get("wording") or wording


def unused_triage(survivors: list[Survivor]) -> list[dict[str, Any]]:
    """Triage entries that describe none of ``survivors`` (their mutants killed since: to delete)."""
    return [entry for entry in load_triage()
            if not any(_matches(entry, s, _only_wording(s)) for s in survivors)]


def _string_tokens(lines: list[str]) -> tuple[list[tuple[int, str]], list[str]] | None:
    """The source's tokens, with string literals apart; None when the lines do not tokenize on their own."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO("\n".join(line.strip() for line in lines)).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    kinds = [(t.type, t.string) for t in tokens if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER)]
    return [(k, "" if k == tokenize.STRING else v) for k, v in kinds], [v for k, v in kinds if k == tokenize.STRING]


def _only_wording(survivor: Survivor) -> bool:
    """Only string literals' text changed, the way mutmut changes it (``"XX...XX"``, upper or lower case)."""
    if len(survivor.minus) != 1 or len(survivor.plus) != 1:
        return False
    before, after = _string_tokens(survivor.minus), _string_tokens(survivor.plus)
    if before is None or after is None or before[0] != after[0]:
        return False
    changed = [(a, b) for a, b in zip(before[1], after[1], strict=True) if a != b]
    return bool(changed) and all(b.replace("XX", "") in (a, a.upper(), a.lower()) or b.upper() == a.upper()
                                 for a, b in changed)


def _message_dropped(survivor: Survivor) -> bool:
    """``raise Error(<message>)`` became ``raise Error(None)``."""
    before = re.fullmatch(r"raise (\w+)\((.+)\)( from \w+)?", survivor.minus[0].strip())
    return before is not None and survivor.plus[0].strip() == f"raise {before[1]}(None){before[3] or ''}"


def collect(modules: list[str]) -> tuple[dict[str, dict[str, Any]], list[Survivor]]:
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    triage = load_triage()
    per_module: dict[str, dict[str, Any]] = {}
    survivors: list[Survivor] = []
    cwd = os.getcwd()
    os.chdir(ROOT)  # mutmut reads mutants/ relative to the working directory
    try:
        for path in modules:
            meta = MUTANTS / f"{path}.meta"
            if not meta.exists():
                continue
            data = json.loads(meta.read_text(encoding="utf-8"))
            scope = SCOPE[path]
            codes = {k: v for k, v in data["exit_code_by_key"].items() if in_scope(k, scope)}
            statuses = Counter(status_by_exit_code[v] for v in codes.values())
            tried = sum(n for s, n in statuses.items() if s not in ("not checked", "skipped"))
            killed = sum(statuses[s] for s in KILLED)
            functions = sorted({function_of(k) for k in codes})
            per_module[path] = {
                "mutants": len(codes), "tried": tried, "killed": killed,
                "kill_rate": round(killed / tried, 4) if tried else None,
                "statuses": dict(sorted(statuses.items())), "tests": list(scope.tests),
                "functions": "all" if scope.functions == ("*",) else functions, "scope_note": scope.note,
                "seconds": round(sum(data.get("durations_by_key", {}).get(k, 0.0) for k in codes), 1),
            }
            for name, code in sorted(codes.items(), key=lambda kv: _mutant_order(kv[0])):
                status = status_by_exit_code[code]
                if status in KILLED or status in ("not checked", "skipped"):
                    continue
                survivor = survivor_of(name, path, status, get_diff_for_mutant(name, path=path), triage)
                survivor.line = locate(path, survivor.function, survivor.diff)
                survivors.append(survivor)
    finally:
        os.chdir(cwd)
    return per_module, survivors


def survivor_of(name: str, path: str, status: str, diff: str, triage: list[dict[str, Any]],
                line: int | None = None) -> Survivor:
    """A mutant that was not killed, from its diff, classified by ``triage``."""
    body = [text for text in diff.splitlines()[2:] if not text.startswith("@@")]
    survivor = Survivor(name=name, file=path, function=function_of(name), line=line, status=status, diff=diff,
                        minus=[text[1:] for text in body if text.startswith("-")],
                        plus=[text[1:] for text in body if text.startswith("+")])
    survivor.triage = match_triage(survivor, triage)
    return survivor


def earlier_results(previous: dict[str, Any], skip: set[str]) -> tuple[dict[str, dict[str, Any]], list[Survivor]]:
    """The modules of the last report that this one does not judge again (run one at a time, their results add
    up), their survivors classified again with the current triage."""
    triage = load_triage()
    per_module = {path: m for path, m in previous.get("modules", {}).items() if path in SCOPE and path not in skip}
    survivors = [survivor_of(s["name"], s["file"], s["status"], s["diff"], triage, s.get("line"))
                 for s in previous.get("survivors", []) if s["file"] in per_module]
    return per_module, survivors


def _mutant_order(name: str) -> tuple[str, int]:
    head, _, number = name.rpartition("__mutmut_")
    return head, int(number) if number.isdigit() else 0


def write_json(meta: dict[str, Any], per_module: dict[str, dict[str, Any]], survivors: list[Survivor]) -> None:
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    payload = {**meta, "modules": per_module, "survivors": [
        {"name": s.name, "file": s.file, "line": s.line, "function": s.function, "status": s.status,
         "class": s.triage.get("class", "unclassified"), "why": s.triage.get("why", ""),
         "test": s.triage.get("test", ""), "diff": s.diff} for s in survivors]}
    RESULTS_JSON.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _one_line(lines: list[str]) -> str:
    text = " / ".join(" ".join(line.split()) for line in lines) or "(nothing)"
    return text.replace("|", "\\|")


def _run_text(run: dict[str, Any]) -> str:
    """When and how a module was run: ``2026-12-04 02:30 UTC, abc1234, 3.1 min`` and its reruns."""
    text = f"{run.get('date', '?')}, {run.get('commit', '?')}, {run.get('duration_min', '?')} min"
    return text + "".join(f"; survivors again {r['date']}, {r['commit']}, {r['duration_min']} min"
                          for r in run.get("reruns") or [])


def markdown(per_module: dict[str, dict[str, Any]], survivors: list[Survivor], notes: list[str]) -> str:
    total_tried = sum(m["tried"] for m in per_module.values())
    total_killed = sum(m["killed"] for m in per_module.values())
    classes = Counter(s.triage.get("class", "unclassified") for s in survivors)
    runs = [m.get("run", {}) for m in per_module.values()]
    versions = sorted({str(r.get("mutmut", "?")) for r in runs})
    children = sorted({str(r.get("max_children", "?")) for r in runs})
    missing = [path for path in SCOPE if path not in per_module]
    out = [SECTION, "",
           f"mutmut {', '.join(versions)}, {' or '.join(children)} mutants at a time, PostgreSQL tests included, "
           "the machine shared with other sessions' test runs. `make mutate` runs every module; here they were "
           "run one at a time (`python -m bench.mutation_report --modules <path>`; the last column says when, at "
           "which commit and for how long"
           + (f"; not run yet: {', '.join(f'`{p}`' for p in missing)}" if missing else "") + "). "
           "Each module is judged by its own test files only (the second column); a mutant counts as killed "
           "when a test fails or the tests hang past mutmut's time limit. Every mutant that was not killed is "
           "listed below with its class: *equivalent* (no test can tell; why), *immaterial* (only a message's "
           "wording) or *gap* (what no test holds, and the test that would). `bench/results/mutation.json` "
           "has the diffs; `bench/mutation_triage.toml` holds the classes; survivors tried again after tests "
           "were added (`--rerun`) are named in the last column.", "",
           *(line for note in notes for line in (note, "")),
           "How: mutmut 3 copies the tree to `mutants/`, mutates each function there behind a trampoline and runs, "
           "for each mutant, the tests that call that function (mapped once by running them all), fastest first. "
           "Subprocesses see the mutants too: `.venv-mutate` (a copy of `.venv` whose editable install points at "
           "`mutants/`) is every interpreter's, gateways and CLIs the tests start inherit the active mutant, and "
           "while the map is made they report the functions they run (`bench/mutation_plugin.py`). Sandbox "
           "workers get the mutant through their command line; a test that starts one counts as calling every "
           "worker function. Log lines are not mutated. The sandbox tests run at the bubblewrap level only.", "",
           "*Kill rate* is of every mutant tried; *of the rest* leaves out the survivors classified equivalent "
           "or immaterial (the mutants that change a behaviour something could rely on).", "",
           "| module | tests | functions | mutants | killed | kill rate | of the rest | not killed | run |",
           "|---|---|---|---|---|---|---|---|---|"]

    def harmless(path: str | None) -> int:
        return sum(1 for s in survivors if (path is None or s.file == path)
                   and s.triage.get("class") in ("equivalent", "immaterial"))

    def percent(killed: int, of: int) -> str:
        return f"{100 * killed / of:.1f}%" if of else "-"

    for path, m in per_module.items():
        functions = "all" if m["functions"] == "all" else f"{len(m['functions'])} ({m['scope_note']})"
        tests = ", ".join(t.removeprefix("tests/") for t in m["tests"] if (ROOT / t).exists())
        out.append(f"| `{path}` | {tests} | {functions} | {m['tried']} | {m['killed']} | "
                   f"{percent(m['killed'], m['tried'])} | {percent(m['killed'], m['tried'] - harmless(path))} | "
                   f"{m['tried'] - m['killed']} | {_run_text(m.get('run', {}))} |")
    out += [f"| **all** | | | {total_tried} | {total_killed} | **{percent(total_killed, total_tried)}** | "
            f"**{percent(total_killed, total_tried - harmless(None))}** | {total_tried - total_killed} | |", "",
            "Not killed, by class: " + (", ".join(f"{c} {n}" for c, n in sorted(classes.items())) or "none") + ".",
            ""]
    for cls, title in (("gap", "Gaps (for the owners: the test that would kill each)"),
                       ("equivalent", "Equivalent mutants (no test can tell them from the code)"),
                       ("immaterial", "Immaterial (a message's wording: no guarantee rests on it)"),
                       ("unclassified", "Not yet classified")):
        group = [s for s in survivors if s.triage.get("class", "unclassified") == cls]
        if not group:
            continue
        out += [f"**{title}**", "", "| where | mutation | status | why | test |", "|---|---|---|---|---|"]
        for s in group:
            change = f"`{_one_line(s.minus)}` → `{_one_line(s.plus)}`"
            out.append(f"| `{s.file}:{s.line}` | {change} | {s.status} | "
                       f"{s.triage.get('why', '').replace('|', '/')} | {s.triage.get('test', '').replace('|', '/')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def write_markdown(text: str) -> None:
    current = RESULTS_MD.read_text(encoding="utf-8")
    start = current.find(SECTION)
    if start < 0:
        RESULTS_MD.write_text(current.rstrip() + "\n\n" + text, encoding="utf-8")
        return
    end = current.find("\n## ", start + len(SECTION))
    tail = current[end + 1:] if end >= 0 else ""
    RESULTS_MD.write_text(current[:start] + text + ("\n" + tail if tail else ""), encoding="utf-8")


def stubs() -> int:
    """Triage entries for the unclassified survivors of the last report, to fill in (class, why, test)."""
    payload = json.loads(RESULTS_JSON.read_text(encoding="utf-8"))
    for s in payload["survivors"]:
        if s["class"] != "unclassified":
            continue
        body = [line for line in s["diff"].splitlines()[2:] if not line.startswith("@@")]
        minus = [line[1:].strip() for line in body if line.startswith("-")]
        plus = [line[1:].strip() for line in body if line.startswith("+")]
        print(f"[[mutant]]  # {s['file']}:{s['line']} {s['status']}")
        print(f"file = {json.dumps(s['file'])}\nfunction = {json.dumps(s['function'], ensure_ascii=False)}")
        print(f"minus = {json.dumps(minus, ensure_ascii=False)}\nplus = {json.dumps(plus, ensure_ascii=False)}")
        print('class = ""\nwhy = ""\n')
    return 0


def publish(checkout: Path) -> int:
    """The JSON and RESULTS.md section of a run in ``checkout``, written into this one."""
    payload = json.loads((checkout / RESULTS_JSON.relative_to(ROOT)).read_text(encoding="utf-8"))
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_JSON.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    write_markdown(payload["markdown"])
    print(f"wrote {RESULTS_JSON.relative_to(ROOT)} and {RESULTS_MD.relative_to(ROOT)} from {checkout}")
    return 0


def report(modules: list[str], runs: dict[str, dict[str, Any]], previous: dict[str, Any], *,
           markdown_section: bool, notes: list[str] | None = None) -> int:
    """The report of ``modules`` from ``mutants/`` (``runs``: when and how each was run), with the other modules
    of the ``previous`` report kept as they were."""
    judged, judged_survivors = collect(modules)
    judged = {path: m for path, m in judged.items() if m["tried"]}  # mutants written, none tried yet: not judged
    if not judged:
        raise SystemExit("no mutmut results in mutants/ (run without --report-only first)")
    for path, m in judged.items():
        m["run"] = runs.get(path, {})
    kept, kept_survivors = earlier_results(previous, set(judged))
    per_module = {path: {**kept, **judged}[path] for path in SCOPE if path in kept or path in judged}
    survivors = [s for s in [*kept_survivors, *judged_survivors] if s.file in per_module]
    survivors.sort(key=lambda s: (list(SCOPE).index(s.file), _mutant_order(s.name)))
    notes = previous.get("notes", []) if notes is None else notes
    text = markdown(per_module, survivors, notes)
    write_json({"markdown": text, "notes": notes}, per_module, survivors)
    if markdown_section:
        write_markdown(text)
    print(text)
    unclassified = sum(1 for s in survivors if not s.triage)
    for entry in unused_triage(survivors):
        print(f"triage entry matching no survivor: {entry.get('file')} {entry.get('function', '*')} "
              f"{entry.get('minus_has') or entry.get('plus_has') or entry.get('plus') or entry.get('minus') or ''}")
    print(f"wrote {RESULTS_JSON.relative_to(ROOT)}" + (f" and {RESULTS_MD.relative_to(ROOT)}" if markdown_section
                                                         else "") + f"; {unclassified} not classified")
    return 0


def commit() -> str:
    """The checkout's commit, and whether tracked files differ from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "?"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="+", choices=list(SCOPE), default=list(SCOPE),
                        help="source files to mutate (default: all of SCOPE)")
    parser.add_argument("--max-children", type=int, default=2,
                        help="mutants tested at a time (2: one per core of a machine shared with other test runs)")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from mutants/")
    parser.add_argument("--fresh", action="store_true",
                        help="start from an empty mutants/ (map every test to the functions it calls again)")
    parser.add_argument("--rerun", action="store_true",
                        help="try the survivors in mutants/ again (after adding tests to the files they ran)")
    parser.add_argument("--no-markdown", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--note", action="append",
                        help="a sentence for the report (about modules not run, say); repeat for more; kept until "
                             "given again")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the project's virtualenv to copy")
    parser.add_argument("--stubs", action="store_true",
                        help="print bench/mutation_triage.toml entries to fill in for the unclassified survivors")
    parser.add_argument("--publish", type=Path, metavar="CHECKOUT",
                        help="copy the report of a run in another checkout (a clean one of a commit, say) here")
    args = parser.parse_args(argv)
    if args.publish:
        return publish(args.publish)
    if args.stubs:
        return stubs()
    started = time.monotonic()
    previous = json.loads(RESULTS_JSON.read_text(encoding="utf-8")) if RESULTS_JSON.exists() else {}
    earlier = {path: m.get("run", {}) for path, m in previous.get("modules", {}).items()}
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    if args.rerun:
        tried = rerun_survivors(args.modules, args.max_children, args.venv)
        again = {"date": when, "commit": commit(), "mutants": tried,
                 "duration_min": round((time.monotonic() - started) / 60, 1)}
        runs = {path: {**earlier.get(path, {}), "reruns": [*earlier.get(path, {}).get("reruns", []), again]}
                for path in args.modules}
    elif not args.report_only:
        run(args.modules, args.max_children, args.venv, fresh=args.fresh)
        this = {"command": "make mutate" if args.modules == list(SCOPE) else
                "python -m bench.mutation_report --modules " + " ".join(args.modules),
                "date": when, "duration_min": round((time.monotonic() - started) / 60, 1),
                "max_children": args.max_children, "mutmut": mutmut_version(), "commit": commit()}
        runs = dict.fromkeys(args.modules, this)
    else:
        runs = {path: earlier.get(path, {}) for path in args.modules}
    return report(args.modules, runs, previous, markdown_section=not args.no_markdown, notes=args.note)


if __name__ == "__main__":
    sys.exit(main())
