"""The deployment files agree with the gateway: entrypoint, probes, config keys, secrets, hardening."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from gateway.cli import build_parser, main
from gateway.config import parse_config
from gateway.http import HttpServer
from gateway.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
_VAR = re.compile(r"\$\{([A-Z0-9_]+)(:-[^}]*)?\}")


def _required_vars(text: str) -> set[str]:
    return {m.group(1) for m in _VAR.finditer(text) if m.group(2) is None}


def _k8s(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "k8s" / name).read_text())


def _routes() -> set[str]:
    cfg = parse_config({})
    server = HttpServer(cfg.http, Metrics(), store=None, readiness=None, summary=None)  # type: ignore[arg-type]
    return {r.canonical for r in server.app.router.resources()}


def test_dockerfile_runs_the_cli_as_non_root_with_a_healthcheck() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["hermes-gateway"]' in text
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["hermes-gateway"] == "gateway.cli:main"
    user = re.search(r"^USER (\d+):(\d+)$", text, re.M)
    assert user is not None, "a numeric user, which Kubernetes' runAsNonRoot can check"
    pod = _k8s("deployment.yaml")["spec"]["template"]["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"]) == (int(user.group(1)), int(user.group(2))) != (0, 0)
    assert "/healthz" in text.split("HEALTHCHECK", 1)[1] and "/healthz" in _routes()
    assert re.search(r"^ENV HERMES_GATEWAY_HOME=/var/lib/hermes-gateway ", text, re.M)
    assert 'VOLUME ["/var/lib/hermes-gateway"]' in text
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd is not None
    args = build_parser().parse_args(yaml.safe_load(cmd.group(1)))
    assert args.command == "run" and args.config == "/etc/hermes-gateway/config.yaml"
    assert text.count("FROM ") == 2, "multi-stage build"


def _unit() -> dict[str, str]:
    lines = [ln for ln in (DEPLOY / "hermes-gateway.service").read_text().splitlines() if "=" in ln
             and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


def test_systemd_unit_is_hardened() -> None:
    unit = _unit()
    assert unit["Restart"] == "on-failure"
    assert unit["NoNewPrivileges"] == "true" and unit["ProtectSystem"] == "strict"
    assert unit["EnvironmentFile"] == "/etc/hermes-gateway/env"
    args = build_parser().parse_args(unit["ExecStart"].split()[1:])
    assert args.command == "run" and args.config == "/etc/hermes-gateway/config.yaml"
    assert unit["DynamicUser"] == "yes" and unit["User"] != "root", "systemd creates the user"
    assert unit["StateDirectory"] == "hermes-gateway"
    assert unit["Environment"] == "HERMES_GATEWAY_HOME=/var/lib/hermes-gateway"
    assert unit["LimitNOFILE"] == "65536"


def test_systemd_unit_does_not_restart_on_a_config_error(tmp_path: Path) -> None:
    unit = _unit()
    assert unit["RestartPreventExitStatus"] == "2"
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 2
    (tmp_path / "bad.yaml").write_text("http:\n  port: many\n")
    assert main(["run", "--config", str(tmp_path / "bad.yaml")]) == 2


def test_systemd_unit_leaves_the_tool_sandbox_what_bubblewrap_needs() -> None:
    unit = _unit()
    # bwrap creates these namespaces, brings up its loopback over netlink, mounts a fresh /proc (refused
    # when parts of /proc are over-mounted) and sets its hostname (refused by ProtectHostname's filter).
    assert set(unit["RestrictNamespaces"].split()) >= {"user", "mnt", "pid", "ipc", "uts", "net"}
    assert "AF_NETLINK" in unit["RestrictAddressFamilies"].split()
    for key in ("ProtectKernelTunables", "ProtectKernelLogs", "ProtectProc", "ProcSubset", "ProtectHostname"):
        assert key not in unit, key


def test_replica_config_validates_with_the_compose_environment() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "gateway-1", "gateway-2", "lb"} <= set(services)
    config_text = (DEPLOY / "config.replicas.yaml").read_text()
    for name in ("gateway-1", "gateway-2"):
        env = services[name]["environment"]
        missing = _required_vars(config_text) - set(env)
        assert not missing, f"{name} does not set {missing}"
        mounts = services[name]["volumes"]
        assert "./config.replicas.yaml:/etc/hermes-gateway/config.yaml:ro" in mounts
    env = dict.fromkeys(_required_vars(config_text), "dummy-value")
    env["HERMES_STORE_URL"] = "postgresql://hermes:pw@postgres:5432/hermes"
    cfg = parse_config(yaml.safe_load(config_text), env=env)
    assert cfg.store.url.startswith("postgresql://") and cfg.http.host == "0.0.0.0"
    assert services["gateway-1"]["environment"]["HERMES_STORE_URL"].startswith("postgresql://")
    assert "gateway-1:8080" in (DEPLOY / "nginx.conf").read_text()


def test_kubernetes_manifests_point_at_real_endpoints_and_config() -> None:
    deployment = _k8s("deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    routes = _routes()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz" in routes
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" in routes
    port = next(p for p in container["ports"] if p["name"] == "http")["containerPort"]
    configmap = _k8s("configmap.yaml")
    config_text = configmap["data"]["config.yaml"]
    assert yaml.safe_load(config_text) == yaml.safe_load((DEPLOY / "config.replicas.yaml").read_text())
    secret = _k8s("secret.template.yaml")
    assert _required_vars(config_text) <= set(secret["stringData"]), "the secret covers every required variable"
    env = dict.fromkeys(_required_vars(config_text), "dummy-value")
    env["HERMES_STORE_URL"] = secret["stringData"]["HERMES_STORE_URL"]
    cfg = parse_config(yaml.safe_load(config_text), env=env)
    assert cfg.http.port == port
    args = build_parser().parse_args(container["args"])
    assert args.command == "run" and args.config.startswith(container["volumeMounts"][0]["mountPath"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert _k8s("service.yaml")["spec"]["selector"] == labels
    assert _k8s("pdb.yaml")["spec"]["selector"]["matchLabels"] == labels
    assert _k8s("hpa.yaml")["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
