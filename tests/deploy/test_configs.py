"""The configs in deploy/ load and deliver only to enabled platforms; the compose file never passes an unset
secret; the Docker build context holds only what the image is built from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gateway.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
_REQUIRED = re.compile(r"\$\{([A-Z0-9_]+)\}")
_ANY_REF = re.compile(r"\$\{([A-Z0-9_]+)([^}]*)\}")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD")
# .dockerignore globs (Go's filepath.Match, plus ** for any number of directories) as regular expressions.
_GLOB = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}


def _fake_env(text: str) -> dict[str, str]:
    """A value of the right shape for every ``${VAR}`` the config requires."""
    env: dict[str, str] = {}
    for name in _REQUIRED.findall(text):
        if name == "TELEGRAM_BOT_TOKEN":
            env[name] = "123456789:AAFakeTokenForTests"
        elif name == "HERMES_STORE_URL":
            env[name] = "postgresql://hermes:fake-password@postgres:5432/hermes"
        elif name.endswith("_ID"):
            env[name] = "-1001234567890" if "CHAT" in name else "123456789"
        else:
            env[name] = f"fake-{name.lower()}"
    return env


def _load(name: str, **extra: str) -> Config:
    path = DEPLOY / name
    return load_config(path, env={**_fake_env(path.read_text()), **extra})


def _enabled_platforms(cfg: Config) -> set[str]:
    platforms = cfg.platforms
    return {name for name, on in (("telegram", platforms.telegram.enabled), ("discord", platforms.discord.enabled),
                                  ("slack", platforms.slack.enabled)) if on}


@pytest.mark.parametrize("name", ["config.minimal.yaml", "config.example.yaml", "config.replicas.yaml"])
def test_config_loads_and_delivers_only_to_enabled_platforms(name: str) -> None:
    cfg = _load(name)
    enabled = _enabled_platforms(cfg)
    for route_name, route in cfg.platforms.webhook.routes.items():
        target = route.delivery
        if target is None:
            continue
        platform, chat = target[0], target[1]
        if platform == "callback":
            assert chat in cfg.platforms.callback.targets, f"{route_name}: no callback target {chat}"
        else:
            assert platform in enabled, f"{name}: route {route_name} delivers to disabled {platform}"


def test_minimal_config_is_a_telegram_bot_with_one_webhook_route() -> None:
    cfg = _load("config.minimal.yaml")
    assert _enabled_platforms(cfg) == {"telegram"}
    (route,) = cfg.platforms.webhook.routes.values()
    assert route.delivery == ("telegram", "-1001234567890", None)
    assert cfg.auth.admins == ["telegram:123456789"]
    text = (DEPLOY / "config.minimal.yaml").read_text()
    secrets = {"OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN", "GITHUB_WEBHOOK_SECRET"}
    assert secrets <= set(_REQUIRED.findall(text)), "secrets come from the environment"
    for var in secrets:  # each is documented in the header
        assert f"#   {var}" in text


def test_minimal_config_listens_where_the_environment_says() -> None:
    assert _load("config.minimal.yaml").http.host == "127.0.0.1"
    assert _load("config.minimal.yaml", HERMES_HTTP_HOST="0.0.0.0").http.host == "0.0.0.0"


def test_container_image_listens_on_all_interfaces() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "COPY deploy/config.minimal.yaml /etc/hermes-gateway/config.yaml" in dockerfile
    env_block = re.search(r"^ENV (.*?)(?<!\\)\n", dockerfile, re.M | re.S)
    assert env_block is not None
    image_env = dict(re.findall(r"([A-Z_]+)=(\S+)", env_block.group(1)))
    cfg = _load("config.minimal.yaml", **image_env)
    assert cfg.http.host == "0.0.0.0"
    assert f"EXPOSE {cfg.http.port}" in dockerfile


def test_compose_requires_every_secret_instead_of_passing_it_empty() -> None:
    text = (DEPLOY / "docker-compose.yml").read_text()
    secrets = {name: rest for name, rest in _ANY_REF.findall(text) if _SECRET_NAME.search(name)}
    assert {"OPENAI_API_KEY", "HERMES_API_TOKEN", "GITHUB_WEBHOOK_SECRET", "POSTGRES_PASSWORD"} <= set(secrets)
    for name, rest in _ANY_REF.findall(text):
        if _SECRET_NAME.search(name):
            assert rest.startswith(":?") and len(rest) > 2, f"${{{name}{rest}}}: write ${{{name}:?message}}"


def test_compose_builds_the_gateway_image_once() -> None:
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    gateways = {name: s for name, s in services.items() if name.startswith("gateway-")}
    assert len(gateways) >= 2
    builders = [name for name, s in services.items() if "build" in s]
    assert builders == ["gateway-1"]
    assert {s["image"] for s in gateways.values()} == {services["gateway-1"]["image"]}


def _dockerignore_excludes(path: str) -> bool:
    """Whether Docker leaves ``path`` out of the build context: the last matching pattern wins, and a pattern
    matches a path or any of its parent directories (moby's patternmatcher)."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        regex = re.compile("".join(_GLOB.get(part) or (part if part.startswith("[") else re.escape(part))
                                   for part in re.split(r"(\*\*/?|\*|\?|\[[^]]*\])", pattern) if part))
        parts = path.split("/")
        if any(regex.fullmatch("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_only_the_build_inputs() -> None:
    for path in (".venv/bin/python", ".venv-mutate/lib/x.py", ".git/HEAD", "mutants/gateway/app.py",
                 "gateway/__pycache__/app.cpython-311.pyc", "state.db", "gateway/state.db-wal", ".env",
                 "deploy/.env", ".pytest_cache/v/x", ".ruff_cache/x", ".hypothesis/x", "tests/conftest.py",
                 "hermes_gateway.egg-info/PKG-INFO", "deploy/config.example.yaml"):
        assert _dockerignore_excludes(path), path
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    copied = [src for line in re.findall(r"^COPY (?!--from)(.*)$", dockerfile, re.M) for src in line.split()[:-1]]
    assert "gateway" in copied and "deploy/config.minimal.yaml" in copied
    for source in copied:
        assert not _dockerignore_excludes(source), source
    for path in ("gateway/app.py", "gateway/config/base.py", "platforms/telegram.py", "tools/sandbox/pool.py"):
        assert not _dockerignore_excludes(path), path
