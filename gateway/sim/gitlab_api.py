"""A GitLab REST API (v4) simulator: issue and merge request notes.

Mounted under ``/api/v4`` as on GitLab; threads are keyed ``<project>#<iid>`` (issue) and ``<project>!<iid>``
(merge request), ``<project>`` being the id or URL-encoded path used in the request.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.sim.forge_api import ForgeSimulator

_KINDS = {"issues": "#", "merge_requests": "!"}


class GitLabAPISimulator(ForgeSimulator):
    """``POST`` creates a note (201), ``GET`` lists them (``per_page``, ``page``, ``Link``); ``PRIVATE-TOKEN``."""

    default_per_page = 20

    def __init__(self, token: str = "glpat-simulated-token") -> None:
        super().__init__(token)
        path = "/api/v4/projects/{project}/{kind:issues|merge_requests}/{iid:\\d+}/notes"
        self.app.router.add_post(path, self._create)
        self.app.router.add_get(path, self._index)

    @property
    def api_url(self) -> str:
        """The API base URL to configure (``platforms.gitlab.api_base_url``)."""
        return f"{self.base_url}/api/v4"

    def _thread(self, request: web.Request) -> str:
        m = request.match_info
        return f"{m['project']}{_KINDS[m['kind']]}{int(m['iid'])}"

    async def _create(self, request: web.Request) -> web.StreamResponse:
        return await self._post(request, self._thread(request))

    async def _index(self, request: web.Request) -> web.Response:
        return await self._list(request, self._thread(request))

    def _authorized(self, request: web.Request) -> bool:
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        return self.token in (request.headers.get("PRIVATE-TOKEN"), bearer)

    def _denied(self) -> web.Response:
        return web.json_response({"message": "401 Unauthorized"}, status=401)

    def _shape(self, thread: str, comment_id: int, body: str, created_at: str) -> dict[str, Any]:
        kind = "MergeRequest" if "!" in thread else "Issue"
        iid = int(thread.rsplit("!" if kind == "MergeRequest" else "#", 1)[1])
        return {"id": comment_id, "type": None, "body": body, "system": False, "noteable_type": kind,
                "noteable_iid": iid, "author": {"id": 1, "username": "hermes-bot", "name": "Hermes"},
                "created_at": created_at, "updated_at": created_at, "confidential": False, "internal": False}
