"""pytest plugin for ``make mutate`` only (mutmut loads it with ``-p bench.mutation_plugin``).

mutmut runs the tests in its copy of the tree (``mutants/``), picks the active mutant from
``MUTANT_UNDER_TEST``, and maps tests to functions by recording calls in the test process. The mutation
virtualenv (``.venv-mutate``, a copy of ``.venv`` whose editable install points at ``mutants/``) makes
every interpreter import the copy, ``python -I`` ones included, and gateways or CLIs the tests start
inherit the variable. Two things need help, and get it here:

- while mutmut maps tests to functions, calls in those subprocesses are invisible to it: they append
  the functions they run to files in ``$HERMES_MUTMUT_HITS`` (the hook ``bench/mutation_report.py``
  installs in ``.venv-mutate``), read here when each test ends. A test that starts a sandbox worker
  (whose environment is an allowlist) counts as covering every function of ``tools/sandbox/worker.py``;
- sandbox workers get no environment from the gateway, and ``-m tools.sandbox.worker`` would run the
  worker as ``__main__``, where no mutant of ``tools.sandbox.worker`` applies: while a mutant is active
  they are started by importing the module, with the mutant set inside the interpreter (not in its
  environment, which the sandbox tests compare with the gateway's).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

_NOT_A_MUTANT = {"", "stats", "list_all_tests", "mutant_generation"}


def _worker_functions() -> set[str]:
    """mutmut's names of the worker's functions (``tools.sandbox.worker.x_serve``), from its meta file."""
    meta = Path("tools/sandbox/worker.py.meta")  # the tests run in mutants/
    if not meta.exists():
        return set()
    keys = json.loads(meta.read_text(encoding="utf-8")).get("exit_code_by_key", {})
    return {key.partition("__mutmut_")[0] for key in keys}


def _worker_command(original: list[str]) -> list[str]:
    from mutmut.mutation.trampoline import get_mutant_under_test
    from mutmut.stats import record_trampoline_hit

    mutant = get_mutant_under_test()
    if mutant == "stats":
        for name in _worker_functions():
            record_trampoline_hit(name)
    if mutant in _NOT_A_MUTANT:
        return original
    boot = ("import sys; import mutmut.mutation.trampoline as t; "
            f"t._mutant_under_test = {mutant!r}; "
            "from tools.sandbox import worker; sys.exit(worker.serve())")
    return [sys.executable, "-I", "-c", boot]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    import tools.sandbox.pool as pool

    if not Path(pool.__file__).resolve().parent.parent.parent.name == "mutants":
        raise pytest.UsageError("bench.mutation_plugin is for mutmut's runs in mutants/ only")
    original = pool.worker_command
    pool.worker_command = lambda: _worker_command(original())
    os.environ.setdefault("HERMES_MUTMUT_HITS", tempfile.mkdtemp(prefix="mutmut-hits-"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Before mutmut files this test's calls (its own teardown hook): add those its subprocesses reported."""
    from mutmut.mutation.trampoline import get_mutant_under_test
    from mutmut.stats import record_trampoline_hit

    hits = Path(os.environ["HERMES_MUTMUT_HITS"])
    for path in hits.glob("*.hits"):
        if get_mutant_under_test() == "stats":
            for name in path.read_text(encoding="utf-8").split():
                record_trampoline_hit(name)
        path.unlink(missing_ok=True)
