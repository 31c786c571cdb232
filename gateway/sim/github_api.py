"""A GitHub REST API simulator: issue and pull request comments (``/repos/{owner}/{repo}/issues/{n}/comments``).

Pull requests are issues to this API, as on GitHub. Threads are keyed ``owner/repo#n``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.sim.forge_api import ForgeSimulator


class GitHubAPISimulator(ForgeSimulator):
    """``POST`` creates a comment (201), ``GET`` lists them (``per_page``, ``page``, ``Link``); Bearer token."""

    default_per_page = 30

    def __init__(self, token: str = "ghs-simulated-token") -> None:
        super().__init__(token)
        self.app.router.add_post("/repos/{owner}/{repo}/issues/{number:\\d+}/comments", self._create)
        self.app.router.add_get("/repos/{owner}/{repo}/issues/{number:\\d+}/comments", self._index)

    def _thread(self, request: web.Request) -> str:
        m = request.match_info
        return f"{m['owner']}/{m['repo']}#{int(m['number'])}"

    async def _create(self, request: web.Request) -> web.StreamResponse:
        return await self._post(request, self._thread(request))

    async def _index(self, request: web.Request) -> web.Response:
        return await self._list(request, self._thread(request))

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() in ("bearer", "token") and token == self.token

    def _denied(self) -> web.Response:
        return web.json_response({"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest",
                                  "status": "401"}, status=401)

    def _shape(self, thread: str, comment_id: int, body: str, created_at: str) -> dict[str, Any]:
        repo, _, number = thread.partition("#")
        return {"id": comment_id, "node_id": f"IC_{comment_id}", "body": body,
                "html_url": f"https://github.com/{repo}/issues/{number}#issuecomment-{comment_id}",
                "issue_url": f"{self.base_url}/repos/{repo}/issues/{number}",
                "user": {"login": "hermes-gateway[bot]", "id": 1, "type": "Bot"},
                "created_at": created_at, "updated_at": created_at, "author_association": "NONE"}
