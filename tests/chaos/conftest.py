"""Options of the chaos test, and the report it leaves in the terminal summary (shown also under ``-q``)."""

from __future__ import annotations

import random

import pytest

from tests.conftest import figures

CI_KILLS = 20


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "the SIGKILL chaos test (tests/chaos)")
    group.addoption("--chaos-kills", type=int, default=None,
                    help=f"how many times the gateway is killed (default {CI_KILLS}, the CI size)")
    group.addoption("--chaos-seed", type=int, default=None, help="seed of the kill schedule and traffic mix")


@pytest.fixture
def chaos_kills(request: pytest.FixtureRequest) -> int:
    """``--chaos-kills`` (options of a conftest below the rootdir exist only when tests/chaos is named)."""
    return request.config.getoption("--chaos-kills", default=None) or CI_KILLS


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """``--chaos-seed``, or a fresh one (the report prints it, so a failing schedule can be replayed)."""
    given = request.config.getoption("--chaos-seed", default=None)
    return given if given is not None else random.SystemRandom().randrange(2**32)


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> list[str]:
    """Lines for the terminal summary, printed whether the test passed or not."""
    return figures(request.config, "chaos test")
