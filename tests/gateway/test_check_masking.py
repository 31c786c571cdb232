"""`hermes-gateway check`: credentials inside URLs and MCP args are masked, and an undecodable ``whsec_`` secret
fails at load (naming the key and the fix) instead of failing every delivery later."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli.check import mask_args, mask_url

ROOT = Path(__file__).resolve().parents[2]
# Values that must never be printed; none is a configured secret field, so only the new masking hides them.
URL_PASSWORD = "model-url-pass-4711"
QUERY_KEY = "query-api-key-0815"
MCP_URL_TOKEN = "mcp-url-token-1337"
ARG_TOKEN = "arg-token-value-2024"
ARG_EQUALS = "arg-equals-value-9000"
ARG_ENV = "arg-env-value-31415"
ARG_URL_PASSWORD = "arg-url-pass-2718"
CONFIGURED_SECRET = "configured-env-secret-1618"  # an MCP env value, repeated in an argument
ALL = (URL_PASSWORD, QUERY_KEY, MCP_URL_TOKEN, ARG_TOKEN, ARG_EQUALS, ARG_ENV, ARG_URL_PASSWORD, CONFIGURED_SECRET)


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**env, "HERMES_GATEWAY_HOME": str(home)}, check=False)


def _write(home: Path, config: dict) -> None:
    (home / "config.yaml").write_text(yaml.safe_dump(config))


def test_check_show_masks_tokens_in_urls_and_mcp_args(tmp_path: Path) -> None:
    _write(tmp_path, {
        "model": {"base_url": f"https://ana:{URL_PASSWORD}@llm.example/v1?api_key={QUERY_KEY}&mode=fast",
                  "api_key": "sk-check-model-key", "name": "m"},
        "mcp_servers": {
            "remote": {"url": f"https://mcp.example/mcp?access_token={MCP_URL_TOKEN}"},
            "local": {"command": "npx", "env": {"GITHUB_TOKEN": CONFIGURED_SECRET},
                      "args": ["-y", "some-mcp-server", "--token", ARG_TOKEN, f"--api-key={ARG_EQUALS}",
                               "-e", f"SERVICE_API_KEY={ARG_ENV}", f"postgresql://app:{ARG_URL_PASSWORD}@db/app",
                               f"--github-pat={CONFIGURED_SECRET}", "--verbose"]},
        },
    })
    done = _cli(tmp_path, "check", "--show")
    assert done.returncode == 0, done.stderr
    for secret in ALL:
        assert secret not in done.stdout and secret not in done.stderr, secret
    resolved = yaml.safe_load(done.stdout)
    assert resolved["model"]["base_url"] == "https://***@llm.example/v1?api_key=***&mode=fast"
    assert "model: m at https://***@llm.example/v1?api_key=***&mode=fast" in done.stderr.splitlines()
    assert resolved["mcp_servers"]["remote"]["url"] == "https://mcp.example/mcp?access_token=***"
    args = resolved["mcp_servers"]["local"]["args"]
    assert args[:8] == ["-y", "some-mcp-server", "--token", "***", "--api-key=***", "-e", "SERVICE_API_KEY=***",
                        "postgresql://***@db/app"]
    assert args[-1] == "--verbose" and CONFIGURED_SECRET not in args[-2]


@pytest.mark.parametrize(("url", "shown"), [
    ("https://user:pw@host/p?x=1", "https://***@host/p?x=1"),
    ("https://ghp_tokenasuser@github.com/o/r.git", "https://***@github.com/o/r.git"),
    ("http://h:8080/sse?token=t&Signature=s&X-Api-Key=k&authToken=a&page=2", "http://h:8080/sse?token=***&Signature"
     "=***&X-Api-Key=***&authToken=***&page=2"),
    ("http://host/path?flag&key=", "http://host/path?flag&key="),
    ("not a url: key=value", "not a url: key=value"),
])
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_mask_args_leaves_options_without_credentials_alone() -> None:
    args = ["--no-auth", "--port", "8080", "--secret", "s", "--log-level=debug", "--password=p", "KEY", "plain"]
    assert mask_args(args) == ["--no-auth", "--port", "8080", "--secret", "***", "--log-level=debug",
                               "--password=***", "KEY", "plain"]


@pytest.mark.parametrize("where", ["route", "callback"])
def test_check_refuses_an_undecodable_whsec_secret_naming_the_key(tmp_path: Path, where: str) -> None:
    bad = "whsec_not*base64"
    routes = {"billing": {"secret": bad if where == "route" else "plain-route-secret",
                          "scheme": "standard-webhooks", "prompt": "p"}}
    targets = {"ops": {"url": "https://ops.example/hook", "secret": bad}} if where == "callback" else {}
    _write(tmp_path, {"model": {"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "name": "m"},
                      "platforms": {"webhook": {"routes": routes}, "callback": {"targets": targets}}})
    done = _cli(tmp_path, "check")
    assert done.returncode == 2
    key = "platforms.webhook.routes.billing.secret" if where == "route" else "platforms.callback.targets.ops.secret"
    assert f"{key}: a whsec_ webhook secret must be base64 after the prefix (copy the whole secret" in done.stderr
    assert bad not in done.stderr and "config OK" not in done.stderr
