"""pytest plugin for ``make mutate`` only (mutmut loads it with ``-p bench.mutation_plugin``).

mutmut runs the tests in its copy of the tree (``mutants/``) and picks the active mutant from
``MUTANT_UNDER_TEST``. The mutation virtualenv (``.venv-mutate``, a copy of ``.venv`` whose editable
install points at ``mutants/``) makes every interpreter import the copy, ``python -I`` ones included.
Gateways the tests start as subprocesses also inherit the variable. The tool sandbox's workers do not:
their environment is built from an allowlist, and ``-m tools.sandbox.worker`` would run the worker as
``__main__``, where no mutant of ``tools.sandbox.worker`` applies. So while a mutant is active this
plugin starts workers by importing the module, with the mutant set inside the interpreter (not in its
environment, which the sandbox tests compare with the gateway's). While mutmut maps tests to functions,
a test that starts a worker counts as covering every function of ``tools/sandbox/worker.py`` (calls in
a subprocess are not seen by mutmut's trampolines).
"""

from __future__ import annotations

import json
import sys
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
