"""`hermes-gateway check`: a summary of the config and its static findings, contacting nothing; `--show` for the
resolved YAML. `doctor` is what starts MCP servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from toolsets import resolve_toolset

ROOT = Path(__file__).resolve().parents[2]
STDIO_SERVER = ROOT / "tests" / "mcp_servers" / "stdio_server.py"
TELEGRAM_TOKEN = "4242:check-token-secret"


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**env, "HERMES_GATEWAY_HOME": str(home)}, check=False)


def _write_config(home: Path, marker: Path) -> None:
    # The MCP server notes that it was started, then runs the test server.
    started = (f"import pathlib, runpy, sys; pathlib.Path({str(marker)!r}).write_text('started'); "
               f"sys.argv = [{str(STDIO_SERVER)!r}]; sys.path.insert(0, {str(STDIO_SERVER.parent)!r}); "
               "runpy.run_path(sys.argv[0], run_name='__main__')")
    (home / "config.yaml").write_text(yaml.safe_dump({
        "model": {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-check-model-key", "name": "m"},
        "platforms": {
            "telegram": {"enabled": True, "token": TELEGRAM_TOKEN},
            "webhook": {"routes": {
                "gh": {"secret": "gh-route-secret", "prompt": "p"},
                "alerts": {"secret": "alerts-route-secret", "prompt": "p", "deliver_to": "discord:123"}}}},
        "toolsets": {"telegram": "safe"},
        "mcp_servers": {"files": {"command": sys.executable, "args": ["-c", started]}},
    }))


def test_check_summarises_warns_and_starts_no_mcp_server(tmp_path: Path) -> None:
    marker = tmp_path / "mcp-started"
    _write_config(tmp_path, marker)
    done = _cli(tmp_path, "check")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # the resolved YAML only with --show
    lines = done.stderr.splitlines()
    assert lines[0] == f"config: {tmp_path / 'config.yaml'}"
    assert "platforms: telegram, webhook (2 routes)" in lines
    assert "  gh: POST /webhooks/gh, github signatures, delivers to none" in lines
    assert f"  telegram: safe ({len(resolve_toolset('safe'))} tools)" in lines
    assert f"  cron: hermes-cron ({len(resolve_toolset('hermes-cron'))} tools)" in lines
    assert f"  webhook gh: hermes-webhook ({len(resolve_toolset('hermes-webhook'))} tools)" in lines
    assert "mcp servers: files (stdio); not contacted (`hermes-gateway doctor` starts them)" in lines
    assert any(line.startswith("tool sandbox: ") for line in lines)
    assert ("warning: webhook alerts: deliver_to discord:123 names discord, which is not enabled; fix: enable "
            "platforms.discord, or change platforms.webhook.routes.alerts.deliver_to") in lines
    assert ("warning: telegram access: nobody may talk to the bot (deny by default); fix: set auth.dm_pairing: "
            "true, or list users in auth.platforms.telegram.allowed_users") in lines
    assert lines[-1] == "config OK"
    assert not marker.exists()

    doctor = _cli(tmp_path, "doctor")
    assert doctor.returncode == 1  # the model is not there
    assert marker.read_text() == "started"
    [mcp] = [line for line in doctor.stdout.splitlines() if line.startswith("ok    mcp files: ")]
    assert mcp.endswith("with 9 tools")


def test_check_show_prints_the_resolved_yaml_with_secrets_masked(tmp_path: Path) -> None:
    _write_config(tmp_path, tmp_path / "mcp-started")
    done = _cli(tmp_path, "check", "--show")
    assert done.returncode == 0, done.stderr
    for secret in (TELEGRAM_TOKEN, "sk-check-model-key", "gh-route-secret"):
        assert secret not in done.stdout and secret not in done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert resolved["platforms"]["telegram"]["token"] == "***"
    assert resolved["platforms"]["webhook"]["routes"]["gh"]["secret"] == "***"
    assert done.stderr.splitlines()[-1] == "config OK"


def test_check_without_a_config_summarises_the_defaults(tmp_path: Path) -> None:
    done = _cli(tmp_path, "check")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "config: none found, the embedded defaults"
    assert "platforms: none enabled" in lines and lines[-1] == "config OK"
