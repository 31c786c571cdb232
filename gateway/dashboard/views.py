"""The dashboard's pages (GET, read-only) and actions (POST, each logged with the operator who took it)."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp_jinja2
from aiohttp import web

from gateway.dashboard.auth import PREFIX, Gatekeeper, operator, see_other
from gateway.dashboard.data import (
    RUN_KINDS,
    RUN_STATUSES,
    DashboardContext,
    RunFilter,
    approve_code,
    list_runs,
    list_sessions,
    overview,
    pending_codes,
    reset_session,
    run_detail,
    webhook_deliveries,
)
from gateway.logs import redactor
from gateway.pairing import format_code
from gateway.store import FINAL_RUN_STATES

logger = logging.getLogger("gateway.dashboard")

CRON_ACTIONS = ("pause", "resume", "run-now", "remove")


class Views:
    """Handlers bound to one gateway."""

    def __init__(self, ctx: DashboardContext, gate: Gatekeeper) -> None:
        self.ctx = ctx
        self.gate = gate

    def routes(self) -> list[web.RouteDef]:
        """The sub-application's routes (paths below /dashboard)."""
        return [web.get("/login", self.login_form), web.post("/login", self.login),
                web.post("/logout", self.logout),
                web.get("/", self.overview), web.get("/api/overview", self.overview_json),
                web.get("/runs", self.runs), web.get("/runs/{run_id}", self.run),
                web.post("/runs/{run_id}/stop", self.stop_run),
                web.get("/sessions", self.sessions), web.post("/sessions/reset", self.reset_session),
                web.get("/cron", self.cron), web.post("/cron/{job_id}/{action}", self.cron_action),
                web.get("/pairing", self.pairing), web.post("/pairing/{action}", self.pairing_action),
                web.get("/webhooks", self.webhooks), web.get("/config", self.config)]

    def _page(self, request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
        session = operator(request)
        flash, session.flash = session.flash, None
        return aiohttp_jinja2.render_template(template, request, {
            "operator": session.operator, "csrf": session.csrf, "flash": flash, **context}, status=status)

    def _done(self, request: web.Request, location: str, message: str) -> web.Response:
        """Log an action with its operator, show ``message`` on the next page, and go there."""
        session = operator(request)
        logger.info("dashboard: %s: %s", session.operator, redactor(message))
        session.flash = message
        return see_other(f"{PREFIX}{location}")

    # -- login ---------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.Response:
        """The login form."""
        return aiohttp_jinja2.render_template("login.html", request, {"error": None})

    async def login(self, request: web.Request) -> web.Response:
        """A token for a session cookie; a wrong one is answered 401, too many from one address 429."""
        if wait := self.gate.login_wait(request):
            refused = aiohttp_jinja2.render_template(
                "login.html", request, {"error": f"Too many failed logins: try again in {wait} s."}, status=429)
            refused.headers["Retry-After"] = str(wait)
            return refused
        form = await request.post()
        response = self.gate.login(request, str(form.get("token", "")))
        return response or aiohttp_jinja2.render_template("login.html", request, {"error": "Wrong token"},
                                                          status=401)

    async def logout(self, request: web.Request) -> web.Response:
        """End the session."""
        return self.gate.logout(request)

    # -- pages ---------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        """Adapters, work in progress, outbox, loop lag, error rate, role, sparklines."""
        return self._page(request, "overview.html", page="overview", data=await overview(self.ctx),
                          series=self.ctx.history.series(), events=f"{PREFIX}/events")

    async def overview_json(self, request: web.Request) -> web.Response:
        """The overview's figures as JSON (what the event stream sends)."""
        text = redactor(json.dumps(await overview(self.ctx), ensure_ascii=False, default=str))
        return web.Response(text=text, content_type="application/json")

    async def runs(self, request: web.Request) -> web.Response:
        """The latest runs, filtered by platform, kind, webhook route and status."""
        where = RunFilter.of(request.query)
        return self._page(request, "runs.html", page="runs", runs=await list_runs(self.ctx.store, where),
                          where=where, kinds=RUN_KINDS, statuses=RUN_STATUSES, platforms=sorted(self.ctx.adapters),
                          routes=sorted(self.ctx.cfg.platforms.webhook.routes), events=f"{PREFIX}/events")

    async def run(self, request: web.Request) -> web.Response:
        """One run: prompt, tool calls, model calls and tokens, delivery parts; live while it runs."""
        run_id = request.match_info["run_id"]
        row = await self.ctx.store.get_run(run_id)
        if row is None:
            raise web.HTTPNotFound(text="no such run")
        detail = run_detail(row, await self.ctx.store.outbox_rows(run_id), [])
        return self._page(request, "run.html", page="runs", run=detail, events=f"{PREFIX}/events?run={run_id}")

    async def sessions(self, request: web.Request) -> web.Response:
        """Sessions per platform, the latest active first."""
        platform = request.query.get("platform", "")
        return self._page(request, "sessions.html", page="sessions", platform=platform,
                          sessions=await list_sessions(self.ctx.store, platform), platforms=sorted(self.ctx.adapters))

    async def cron(self, request: web.Request) -> web.Response:
        """Every cron job: schedule, next fire in its time zone, last result."""
        return self._page(request, "cron.html", page="cron", jobs=await self.ctx.cron.list_jobs(None))

    async def pairing(self, request: web.Request) -> web.Response:
        """Pending pairing codes and approved users."""
        return self._page(request, "pairing.html", page="pairing", pending=await pending_codes(self.ctx),
                          approved=await self.ctx.router.pairing.approved(), format_code=format_code)

    async def webhooks(self, request: web.Request) -> web.Response:
        """Webhook routes and their recent deliveries."""
        return self._page(request, "webhooks.html", page="webhooks", routes=self.ctx.cfg.platforms.webhook.routes,
                          deliveries=webhook_deliveries(self.ctx))

    async def config(self, request: web.Request) -> web.Response:
        """The configuration, every secret masked."""
        text = json.dumps(self.ctx.cfg.masked(), ensure_ascii=False, indent=2, default=str)
        return self._page(request, "config.html", page="config", config=text, source=self.ctx.cfg.source)

    # -- actions -------------------------------------------------------------

    async def stop_run(self, request: web.Request) -> web.Response:
        """Stop a run where it runs (any replica), or cancel it before it starts."""
        run_id = request.match_info["run_id"]
        row = await self.ctx.store.get_run(run_id)
        if row is None:
            raise web.HTTPNotFound(text="no such run")
        stopped = row.status not in FINAL_RUN_STATES and await self.ctx.router.stop_run(row)
        message = f"stopped run {run_id}" if stopped else f"run {run_id} was not running ({row.status})"
        return self._done(request, f"/runs/{run_id}", message)

    async def reset_session(self, request: web.Request) -> web.Response:
        """Start a session's next conversation, as /new does."""
        key = str((await request.post()).get("key", ""))
        done = await reset_session(self.ctx.store, key)
        return self._done(request, "/sessions", f"started a new conversation in session {key}" if done
                          else f"no session {key}")

    async def cron_action(self, request: web.Request) -> web.Response:
        """Pause, resume, run now or remove a cron job (as /cron does for an admin)."""
        job_id, action = request.match_info["job_id"], request.match_info["action"]
        cron = self.ctx.cron
        if action not in CRON_ACTIONS:
            raise web.HTTPNotFound(text="no such action")
        if action == "remove":
            done = await cron.remove(job_id, None)
        elif action == "run-now":
            run_id = await cron.run_now(job_id, None)
            done = run_id is not None
            action = f"run-now (run {run_id})" if done else action
        else:
            done = await (cron.pause if action == "pause" else cron.resume)(job_id, None) is not None
        return self._done(request, "/cron", f"cron job {job_id}: {action}" if done
                          else f"cron job {job_id}: {action} did nothing (no such job, or fired just now)")

    async def pairing_action(self, request: web.Request) -> web.Response:
        """Approve or deny a pending code, or revoke an approved user."""
        action, form = request.match_info["action"], await request.post()
        pairing, who = self.ctx.router.pairing, operator(request).operator
        if action == "approve":
            _, message = await approve_code(self.ctx, str(form.get("code", "")), who)
        elif action == "deny":
            code = str(form.get("code", ""))
            message = f"denied pairing code {code}" if await pairing.deny(code) else f"no pending code {code}"
        elif action == "revoke":
            platform, user_id = str(form.get("platform", "")), str(form.get("user_id", ""))
            message = (f"revoked {platform}:{user_id}" if await pairing.revoke(platform, user_id)
                       else f"no approved user {platform}:{user_id}")
        else:
            raise web.HTTPNotFound(text="no such action")
        return self._done(request, "/pairing", message)
