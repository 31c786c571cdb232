"""Which payload shapes each GitHub event has, so the unsigned ``X-GitHub-Event`` header cannot relabel a
signed payload past a route's event filter (a captured ``issue_comment`` delivery sent again as ``issues``).

Only events listed here are checked; for any other event the header alone names it. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, slots=True)
class _Shape:
    """Top-level keys the payload must have, and keys that mark a related event instead."""

    required: frozenset[str]
    forbidden: frozenset[str] = frozenset()


def _shape(required: str, forbidden: str = "") -> _Shape:
    return _Shape(frozenset(required.split()), frozenset(forbidden.split()))


# Keys from GitHub's webhook payload reference; `forbidden` separates events whose payloads contain another's.
SHAPES: Mapping[str, _Shape] = MappingProxyType({
    "push": _shape("ref pusher", "ref_type"),
    "create": _shape("ref ref_type master_branch"),
    "delete": _shape("ref ref_type", "master_branch"),
    "issues": _shape("issue", "comment"),
    "issue_comment": _shape("issue comment"),
    "pull_request": _shape("pull_request number", "review comment thread"),
    "pull_request_review": _shape("pull_request review"),
    "pull_request_review_comment": _shape("pull_request comment"),
    "pull_request_review_thread": _shape("pull_request thread"),
    "commit_comment": _shape("comment", "issue pull_request discussion"),
    "discussion": _shape("discussion", "comment"),
    "discussion_comment": _shape("discussion comment"),
    "release": _shape("release"),
    "workflow_run": _shape("workflow_run workflow", "deployment"),
    "workflow_job": _shape("workflow_job"),
    "workflow_dispatch": _shape("workflow inputs ref"),
    "check_run": _shape("check_run", "deployment_status"),
    "check_suite": _shape("check_suite"),
    "deployment": _shape("deployment", "deployment_status workflow_job deployment_callback_url"),
    "deployment_status": _shape("deployment_status deployment"),
    "status": _shape("sha state context"),
    "fork": _shape("forkee"),
    "star": _shape("starred_at"),
    "ping": _shape("zen hook_id"),
})


def payload_fits(event: str, payload: Any) -> bool:
    """Whether ``payload`` has the shape of GitHub event ``event`` (always true for events not in SHAPES)."""
    shape = SHAPES.get(event)
    if shape is None:
        return True
    if not isinstance(payload, Mapping):
        return False
    return shape.required.issubset(payload) and shape.forbidden.isdisjoint(payload)
