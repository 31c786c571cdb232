"""How `hermes-gateway` finds its config without flags, its `.env`, admin commands that read only the store
part of the config, and their `--json` output: the CLI run as a subprocess with a controlled environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, cli_command, discover_config, load_config, load_store_config
from gateway.cron_store import CronStore
from gateway.pairing import PairingStore, approve_command
from gateway.store import NewRun, Store
from tools.cronjob_tools import CronJob, parse_schedule, resolve_timezone

ROOT = Path(__file__).resolve().parents[2]
# Secrets a full config refers to and admin commands must not need.
SECRETS_CONFIG = {
    "model": {"api_key": "${OPENAI_API_KEY}"},
    "platforms": {"telegram": {"enabled": True, "token": "${TELEGRAM_BOT_TOKEN}"}},
    "auth": {"dm_pairing": True, "admins": ["telegram:${ADMIN_ID}"]},
}


def _cli(home: Path, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m gateway ARGS` with only PATH, the home and ``env`` in its environment."""
    clean = {"PATH": os.environ["PATH"], "HERMES_GATEWAY_HOME": str(home), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60,
                          env=clean, cwd=cwd or home)


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _store_at(db: Path, **extra: Any) -> dict[str, Any]:
    return {"store": {"url": f"sqlite:///{db}"}, **extra}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def test_discovery_order_flag_then_env_var_then_home(home: Path, tmp_path: Path) -> None:
    """Each candidate points at its own database; the one `runs list` creates tells which config was read."""
    flag = _write(tmp_path / "flag.yaml", _store_at(tmp_path / "flag.db"))
    by_env = _write(tmp_path / "env.yaml", _store_at(tmp_path / "env.db"))
    _write(home / "config.yaml", _store_at(tmp_path / "home.db"))
    assert _cli(home, "runs", "list", "--config", str(flag), HERMES_GATEWAY_CONFIG=str(by_env)).returncode == 0
    assert [p.name for p in tmp_path.glob("*.db")] == ["flag.db"]
    assert _cli(home, "runs", "list", HERMES_GATEWAY_CONFIG=str(by_env)).returncode == 0
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["env.db", "flag.db"]
    assert _cli(home, "runs", "list").returncode == 0
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["env.db", "flag.db", "home.db"]


def test_discover_config_unit(home: Path, tmp_path: Path) -> None:
    env = {"HERMES_GATEWAY_HOME": str(home)}
    assert discover_config(None, env) is None  # no file in the home: the embedded defaults
    (home / "config.yaml").write_text("{}")
    assert discover_config(None, env) == home / "config.yaml"
    assert discover_config(None, {**env, "HERMES_GATEWAY_CONFIG": "/etc/x.yaml"}) == Path("/etc/x.yaml")
    assert discover_config(tmp_path / "y.yaml", {**env, "HERMES_GATEWAY_CONFIG": "/etc/x.yaml"}) == tmp_path / "y.yaml"


@pytest.mark.parametrize("before", [True, False])
def test_config_flag_before_or_after_the_subcommand(home: Path, tmp_path: Path, before: bool) -> None:
    config = _write(tmp_path / "c.yaml", _store_at(tmp_path / "picked.db"))
    args = ["--config", str(config), "cron", "list"] if before else ["cron", "list", "--config", str(config)]
    done = _cli(home, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no cron jobs\n" and (tmp_path / "picked.db").is_file()


def test_dotenv_beside_the_config_fills_vars_but_never_overrides_the_environment(home: Path, tmp_path: Path) -> None:
    config = _write(tmp_path / "etc" / "config.yaml", {"store": {"url": "sqlite:///${STATE_DIR}/state.db"}})
    (tmp_path / "etc" / ".env").write_text(f"STATE_DIR={tmp_path / 'from-dotenv'}\n")
    for name in ("from-dotenv", "from-env"):
        (tmp_path / name).mkdir()
    assert _cli(home, "runs", "list", "-c", str(config)).returncode == 0
    assert (tmp_path / "from-dotenv" / "state.db").is_file()
    assert _cli(home, "runs", "list", "-c", str(config), STATE_DIR=str(tmp_path / "from-env")).returncode == 0
    assert (tmp_path / "from-env" / "state.db").is_file()


def test_dotenv_in_the_home_beside_the_discovered_config(home: Path) -> None:
    """No flags, no HERMES_GATEWAY_CONFIG: the home's config.yaml gets its secrets from the home's .env."""
    _write(home / "config.yaml", SECRETS_CONFIG)
    failed = _cli(home, "check")
    assert failed.returncode == 2 and "platforms.telegram.token: environment variable TELEGRAM_BOT_TOKEN is not " \
                                      "set" in failed.stderr
    (home / ".env").write_text("OPENAI_API_KEY=sk-x\nTELEGRAM_BOT_TOKEN=123:abc\nADMIN_ID=7\n")
    checked = _cli(home, "check")
    assert checked.returncode == 0, checked.stderr


def test_admin_commands_need_only_the_store(home: Path, tmp_path: Path) -> None:
    """A config whose platforms and model secrets are not exported: `run` would refuse it, the admin commands
    work; the store section is still validated with the usual errors."""
    config = _write(tmp_path / "c.yaml", {**SECRETS_CONFIG, **_store_at(tmp_path / "s.db"),
                                          "cron": {"sync_interval_seconds": 7, "timezone": "${TZ_NAME}"}})
    for args in (["runs", "list"], ["pairing", "list"], ["cron", "list"], ["cron", "run", "nope"]):
        done = _cli(home, *args, "-c", str(config))
        assert "config error" not in done.stderr, (args, done.stderr)
        assert done.returncode == (1 if args[1] == "run" else 0), (args, done.stderr)
    assert _cli(home, "check", "-c", str(config)).returncode == 2
    broken = _write(tmp_path / "broken.yaml", {**SECRETS_CONFIG, "store": {"url": "${DB_URL}", "pool": 3}})
    done = _cli(home, "pairing", "list", "-c", str(broken))
    assert done.returncode == 2
    assert "store.url: environment variable DB_URL is not set (export it, or write ${DB_URL:-default})" in done.stderr
    assert "TELEGRAM_BOT_TOKEN" not in done.stderr


def test_store_config_reads_only_its_keys(tmp_path: Path) -> None:
    config = _write(tmp_path / "c.yaml", {**SECRETS_CONFIG, "store": {"url": "sqlite:///rel/s.db"},
                                          "auth": {"pairing_code_ttl_seconds": "${TTL:-120}", "max_pending_codes": 9,
                                                   "admins": ["${ADMIN}"]},
                                          "cron": {"sync_interval_seconds": 2, "timezone": "Nowhere/Else"}})
    cfg = load_store_config(config, {})
    assert cfg.store.url == f"sqlite:///{tmp_path}/rel/s.db" and cfg.source == config
    assert (cfg.auth.pairing_code_ttl_seconds, cfg.auth.max_pending_codes, cfg.cron.sync_interval_seconds) == (
        120, 9, 2)
    bad = _write(tmp_path / "bad.yaml", {"auth": {"max_pending_codes": 0}, "cron": {"sync_interval_seconds": "x"}})
    with pytest.raises(ConfigError) as caught:
        load_store_config(bad, {})
    assert [e.path for e in caught.value.errors] == ["auth.max_pending_codes", "cron.sync_interval_seconds"]


def test_defaults_keep_the_store_in_the_home_wherever_the_command_runs(home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _cli(home, "pairing", "list", cwd=elsewhere).returncode == 0
    assert (home / "state.db").is_file() and list(elsewhere.iterdir()) == []
    assert load_config(None, {"HERMES_GATEWAY_HOME": str(home)}).store.url == f"sqlite:///{home}/state.db"


def test_hint_commands_carry_config_only_when_discovery_would_miss_it(home: Path, tmp_path: Path) -> None:
    env = {"HERMES_GATEWAY_HOME": str(home)}
    in_home = _write(home / "config.yaml", {})
    other = _write(tmp_path / "my config.yaml", {})
    assert cli_command("runs list", in_home, env) == "hermes-gateway runs list"
    assert cli_command("runs list", None, env) == "hermes-gateway runs list"
    assert cli_command("runs list", other, env) == f"hermes-gateway --config '{other}' runs list"
    assert cli_command("runs list", other, {**env, "HERMES_GATEWAY_CONFIG": str(other)}) == "hermes-gateway runs list"
    assert approve_command("ABCDEFGH", other) == f"hermes-gateway --config '{other}' pairing approve ABCD-EFGH"


async def _seed(db: Path) -> None:
    store = await Store.open(f"sqlite:///{db}")
    try:
        await store.accept("e1", "webhook", "webhook", "webhook:gh:r1", {"target": {}},
                           NewRun("r1", "webhook", "webhook:gh", ["hermes-webhook"], "summarise"))
        pairing = PairingStore(store)
        await pairing.issue("telegram", "42", "ana", "42")
        approved = await pairing.issue("telegram", "43", None, "43")
        assert approved is not None and (await pairing.approve(approved, "cli")).ok
        now = datetime.now(UTC)
        job = CronJob(id="", owner="telegram:42", prompt="standup", schedule=parse_schedule(
            "every 1h", resolve_timezone("UTC"), now), timezone="UTC", origin_platform="telegram", origin_chat_id="42")
        job.next_fire_at = now + timedelta(hours=1)
        await CronStore(store).create(job)
    finally:
        await store.close()


async def test_json_lists(home: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    await _seed(db)
    config = _write(tmp_path / "c.yaml", _store_at(db))

    def listed(*args: str) -> list[dict[str, Any]]:
        done = _cli(home, *args, "list", "--json", "-c", str(config))
        assert done.returncode == 0, done.stderr
        value = json.loads(done.stdout)
        assert isinstance(value, list) and all(isinstance(item, dict) for item in value)
        return value

    (run,) = listed("runs")
    assert (run["id"], run["kind"], run["status"], run["duration_seconds"]) == ("r1", "webhook", "queued", None)
    pending, approved = listed("pairing")
    assert pending.keys() == approved.keys()
    assert (pending["status"], pending["user_id"], pending["user_name"], pending["approved_by"]) == (
        "pending", "42", "ana", None)
    assert len(pending["code"]) == 9 and datetime.fromisoformat(pending["expires_at"]) > datetime.now(UTC)
    assert (approved["status"], approved["user_id"], approved["code"], approved["approved_by"]) == (
        "approved", "43", None, "cli")
    (job,) = listed("cron")
    assert (job["owner"], job["prompt"], job["state"]) == ("telegram:42", "standup", "active")
    empty = _write(tmp_path / "empty.yaml", _store_at(tmp_path / "empty.db"))
    for group in ("runs", "pairing", "cron"):
        done = _cli(home, group, "list", "--json", "-c", str(empty))
        assert done.returncode == 0 and json.loads(done.stdout) == []
