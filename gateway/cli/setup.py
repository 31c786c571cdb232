"""``setup``: ask for (or take as flags) the model endpoint, the platforms' tokens and the webhook routes, check
each live, and write a minimal commented ``config.yaml`` plus a ``.env`` (mode 0600) with the secrets it
references as ``${VAR}``, into the gateway's home."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli.common import HOME_ENV, CliError, common_parent, home_dir

if TYPE_CHECKING:
    from gateway.config import Config
    from gateway.probes import CheckResult

ORDER = 1
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_PROMPT = "A {event} event arrived on webhook {route}. Summarise what happened in two sentences."


@dataclass(frozen=True, slots=True)
class _Token:
    """One secret of a platform: its flag, the ``.env`` variable, its key in the platform's section, the prompt."""

    flag: str
    env: str
    key: str
    prompt: str


_TOKENS: dict[str, tuple[_Token, ...]] = {
    "telegram": (_Token("telegram_token", "HERMES_TELEGRAM_TOKEN", "token", "Telegram bot token from @BotFather"),),
    "slack": (_Token("slack_bot_token", "HERMES_SLACK_BOT_TOKEN", "bot_token", "Slack bot token (xoxb-...)"),
              _Token("slack_app_token", "HERMES_SLACK_APP_TOKEN", "app_token",
                     "Slack app-level token for Socket Mode (xapp-...)")),
    "discord": (_Token("discord_token", "HERMES_DISCORD_TOKEN", "token", "Discord bot token (Developer Portal, Bot)"),),
}
# flag -> the platform section's key for its API base URL
_BASE_URLS = {"telegram": ("telegram_base_url", "base_url"), "slack": ("slack_api_base_url", "api_base_url"),
              "discord": ("discord_api_base_url", "api_base_url")}


@dataclass(slots=True)
class _Plan:
    """What will be written: config data (secrets as ``${VAR}``) and the secrets by variable name."""

    home: Path
    data: dict[str, Any] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """The environment the written config is read with (the real environment wins over ``.env``)."""
        return {**self.secrets, HOME_ENV: str(self.home), **os.environ}

    def parse(self) -> Config:
        """The config as the loader reads it; ConfigError when it is invalid."""
        from gateway.config import parse_config

        return parse_config(self.data, {**self.secrets, HOME_ENV: str(self.home)})

    def secret(self, name: str, value: str) -> str:
        """Keep ``value`` in ``.env`` as ``name``; the ``${name}`` reference for the config."""
        if "\n" in value or "\r" in value:
            raise CliError(f"{name}: a secret cannot contain a line break")
        self.secrets[name] = value
        return f"${{{name}}}"


# -- the answers -------------------------------------------------------------------------------------------------


def _model(plan: _Plan, base_url: str, name: str, api_key: str) -> None:
    plan.data["model"] = {"base_url": base_url, "name": name,
                          **({"api_key": plan.secret("HERMES_MODEL_API_KEY", api_key)} if api_key else {})}


def _platform(plan: _Plan, name: str, tokens: dict[str, str], base_url: str | None) -> None:
    section: dict[str, Any] = {"enabled": True}
    for token in _TOKENS[name]:
        section[token.key] = plan.secret(token.env, tokens[token.flag])
    if base_url:
        section[_BASE_URLS[name][1]] = base_url
        if name == "telegram" and base_url.endswith("/bot"):  # files are served beside the API, as by Telegram
            section["base_file_url"] = base_url.removesuffix("/bot") + "/file/bot"
    plan.data.setdefault("platforms", {})[name] = section


def _routes(plan: _Plan, names: list[str], scheme: str, deliver_to: str) -> None:
    routes = {name: {"secret": plan.secret(f"HERMES_WEBHOOK_{name.upper().replace('-', '_')}_SECRET",
                                           secrets.token_hex(32)),
                     "scheme": scheme, "prompt": DEFAULT_PROMPT, "deliver_to": deliver_to} for name in names}
    if routes:
        plan.data.setdefault("platforms", {})["webhook"] = {"routes": routes}


def _base(plan: _Plan, host: str, port: int) -> None:
    plan.data["store"] = {"url": f"sqlite:///{plan.home / 'state.db'}"}
    plan.data["gateway"] = {"workspace": str(plan.home / "workspace")}
    plan.data["http"] = {"host": host, "port": port, "api_token": plan.secret("HERMES_API_TOKEN",
                                                                              secrets.token_urlsafe(32))}
    plan.data["auth"] = {"dm_pairing": True}


def _from_flags(args: argparse.Namespace, plan: _Plan) -> None:
    _model(plan, args.model_base_url, args.model, args.model_api_key or "")
    for name, tokens in _TOKENS.items():
        given = {t.flag: getattr(args, t.flag) for t in tokens if getattr(args, t.flag)}
        if not given:
            continue
        if len(given) < len(tokens):
            missing = next(t.flag for t in tokens if t.flag not in given)
            raise CliError(f"{name} needs --{missing.replace('_', '-')} too", 2)
        _platform(plan, name, given, getattr(args, _BASE_URLS[name][0]))
    _routes(plan, args.webhook_route, args.webhook_scheme, args.webhook_deliver_to)


def _probe(plan: _Plan, sections: list[str], timeout: float) -> list[CheckResult]:
    """Live checks of the model and/or platforms in ``sections`` (a config error is a failed check)."""
    from gateway.config import ConfigError
    from gateway.probes import PLATFORM_PROBES, CheckResult, probe_model

    try:
        cfg = plan.parse()
    except ConfigError as exc:
        return [CheckResult(e.path or "config", "fail", e.message, e.hint or "give another value") for e in exc.errors]

    async def run() -> list[CheckResult]:
        return list(await asyncio.gather(*(probe_model(cfg.model, timeout) if name == "model" else
                                           PLATFORM_PROBES[name](getattr(cfg.platforms, name), timeout)
                                           for name in sections)))
    return asyncio.run(run())


_NO_ANSWER = "no answer: the input ended (pass --non-interactive and flags to set up without questions)"


def _ask(prompt: str, default: str = "") -> str:
    shown = f" [{default}]" if default else ""
    try:
        return input(f"{prompt}{shown}: ").strip() or default
    except EOFError:
        raise CliError(_NO_ANSWER, 2) from None


def _ask_secret(prompt: str) -> str:
    import getpass

    try:
        return getpass.getpass(f"{prompt} (hidden): ").strip()
    except EOFError:
        raise CliError(_NO_ANSWER, 2) from None


def _confirmed(results: list[CheckResult]) -> bool:
    """Print the checks; True when they passed or the user keeps the answers anyway."""
    for result in results:
        print(f"  {result.line()}")
    if all(r.status != "fail" for r in results):
        return True
    return _ask("  keep these answers anyway? [y/N]").lower().startswith("y")


def _interactive(args: argparse.Namespace, plan: _Plan) -> None:
    print(f"hermes-gateway setup writes {plan.home / 'config.yaml'} and {plan.home / '.env'}; Ctrl-C stops it.")
    print("The model: an OpenAI-compatible chat completions endpoint.")
    while True:
        _model(plan, _ask("  base URL", args.model_base_url), _ask("  model name", args.model),
               _ask_secret("  API key, empty for none"))
        if args.no_check or _confirmed(_probe(plan, ["model"], args.timeout)):
            break
    for name, tokens in _TOKENS.items():
        while True:
            first = _ask_secret(f"{tokens[0].prompt}, empty to skip {name}")
            if not first:
                break
            given = {tokens[0].flag: first, **{t.flag: _ask_secret(t.prompt) for t in tokens[1:]}}
            _platform(plan, name, given, getattr(args, _BASE_URLS[name][0]))
            if args.no_check or _confirmed(_probe(plan, [name], args.timeout)):
                break
            del plan.data["platforms"][name]
            for token in tokens:
                del plan.secrets[token.env]
    names = _ask("Webhook routes (POST /webhooks/NAME), comma-separated, empty for none")
    _routes(plan, [n.strip() for n in names.split(",") if n.strip()], args.webhook_scheme, args.webhook_deliver_to)
    port = _ask("HTTP port", str(args.http_port))
    if not port.isdigit():
        raise CliError(f"not a port number: {port!r}", 2)
    _base(plan, args.http_host, int(port))


# -- writing ---------------------------------------------------------------------------------------------------

_HEADER = """\
# hermes-gateway config, written by `hermes-gateway setup`.
# The secrets are in .env beside this file (mode 0600), referenced here as ${VAR}; a variable set in the
# environment wins over .env. Every key left out takes its default (deploy/config.example.yaml lists them).
# Check it: hermes-gateway check    Check everything it names, live: hermes-gateway doctor
"""
_COMMENTS = {
    "model": "The OpenAI-compatible chat completions endpoint.",
    "store": "Sessions, runs, pairings and cron jobs.",
    "gateway": "The only directory the tools may read and write.",
    "http": "The HTTP server: /healthz, /readyz, /metrics, POST /webhooks/<route>; /runs/<id> needs\n"
            "# `Authorization: Bearer <api_token>`.",
    "auth": "Nobody may talk to the bot until approved: a stranger who DMs it gets a pairing code,\n"
            "# approved with `hermes-gateway pairing approve CODE`.",
    "platforms": "Chat platforms, and signed webhooks whose runs deliver to deliver_to (none: only /runs/<id>).",
}


def _render(plan: _Plan) -> str:
    import yaml

    blocks = [_HEADER]
    for section in ("model", "store", "gateway", "http", "auth", "platforms"):
        if section in plan.data:
            dumped = yaml.safe_dump({section: plan.data[section]}, sort_keys=False, allow_unicode=True, width=120)
            blocks.append(f"# {_COMMENTS[section]}\n{dumped}")
    return "\n".join(blocks)


def _dotenv(values: dict[str, str]) -> str:
    # python-dotenv reads single-quoted values literally, except for \\ and \'.
    quoted = {k: v.replace("\\", "\\\\").replace("'", "\\'") for k, v in values.items()}
    return "# Secrets of config.yaml, written by `hermes-gateway setup`. Keep this file private.\n" + \
        "".join(f"{k}='{v}'\n" for k, v in quoted.items())


def _write(plan: _Plan) -> tuple[Path, Path]:
    from gateway.config import load_config

    config, dotenv = plan.home / "config.yaml", plan.home / ".env"
    plan.home.mkdir(parents=True, exist_ok=True)
    config.write_text(_render(plan), encoding="utf-8")
    fd = os.open(dotenv, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_TRUNC
        out.write(_dotenv(plan.secrets))
    load_config(config, plan.env())  # what `run` will read: a ConfigError here is a bug of setup
    return config, dotenv


def _next_steps(plan: _Plan, config: Path) -> list[str]:
    from gateway.config import cli_command

    chats = [name for name in _TOKENS if name in plan.data.get("platforms", {})]
    http = plan.data["http"]
    lines = ["", "Next:", "  start the gateway:", f"    {cli_command('run', config)}"]
    if chats:
        lines += [f"  then DM your bot on {' or '.join(chats)}: it answers with a pairing code. Approve it with:",
                  f"    {cli_command('pairing approve CODE', config)}"]
    routes = plan.data.get("platforms", {}).get("webhook", {}).get("routes", {})
    where = f"http://{http['host']}:{http['port']}" if http["port"] else "the address `run` prints, "
    lines += [f"  webhook {name}: POST {where}/webhooks/{name}, signed ({route['scheme']}) with "
              f"{route['secret'][2:-1]} from {plan.home / '.env'}" for name, route in routes.items()]
    lines += ["  check everything again at any time:", f"    {cli_command('doctor', config)}"]
    return lines


def _cmd_setup(args: argparse.Namespace) -> int:
    home = Path(args.home).expanduser().absolute() if args.home else home_dir().absolute()
    existing = [p for p in (home / "config.yaml", home / ".env") if p.exists()]
    if existing and not args.force:
        raise CliError(f"{existing[0]} exists; pass --force to replace {' and '.join(p.name for p in existing)}")
    plan = _Plan(home)
    if args.non_interactive:
        _from_flags(args, plan)
        _base(plan, args.http_host, args.http_port)
        plan.parse()  # a ConfigError names the key (exit 2)
        if not args.no_check:
            sections = ["model", *(name for name in _TOKENS if name in plan.data.get("platforms", {}))]
            results = _probe(plan, sections, args.timeout)
            for result in results:
                print(result.line())
            if any(r.status == "fail" for r in results):
                raise CliError("nothing written: fix what failed above, or pass --no-check to write it anyway")
    else:
        _interactive(args, plan)
    for name, value in plan.secrets.items():
        if os.environ.get(name, value) != value:
            print(f"warning: {name} is set in the environment, which wins over .env", file=sys.stderr)
    config, dotenv = _write(plan)
    print(f"wrote {config} and {dotenv} (the secrets, mode 0600)")
    print("\n".join(_next_steps(plan, config)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``setup``."""
    setup = sub.add_parser(
        "setup", parents=[common_parent()], help="write a config and .env: asks, or takes flags (--non-interactive)",
        description="Write config.yaml and .env (the secrets, mode 0600) into the gateway's home, after checking "
                    "the model and each platform token live. Interactive unless --non-interactive. Secrets given "
                    "as flags are visible to other users in the process list; the questions hide them.")
    setup.add_argument("--home", metavar="DIR", help=f"where to write (default ${HOME_ENV}, else ~/.hermes-gateway)")
    setup.add_argument("--force", action="store_true", help="replace an existing config.yaml and .env")
    setup.add_argument("--non-interactive", action="store_true", help="take every answer from the flags below")
    setup.add_argument("--no-check", action="store_true", help="write without checking the answers live")
    setup.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="for each live check")
    model = setup.add_argument_group("model")
    model.add_argument("--model-base-url", default=DEFAULT_BASE_URL, metavar="URL")
    model.add_argument("--model-api-key", metavar="KEY")
    model.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME")
    platforms = setup.add_argument_group("platforms (each enabled by its token)")
    for tokens in _TOKENS.values():
        for token in tokens:
            platforms.add_argument(f"--{token.flag.replace('_', '-')}", metavar="TOKEN")
    for flag, _key in _BASE_URLS.values():
        platforms.add_argument(f"--{flag.replace('_', '-')}", metavar="URL",
                               help="a self-hosted or simulated API (default: the platform's own)")
    webhooks = setup.add_argument_group("webhooks")
    webhooks.add_argument("--webhook-route", action="append", default=[], metavar="NAME",
                          help="serve POST /webhooks/NAME, signed with a generated secret (repeatable)")
    webhooks.add_argument("--webhook-scheme", default="github", choices=["github", "standard-webhooks", "hmac-sha256"])
    webhooks.add_argument("--webhook-deliver-to", default="none", metavar="TARGET",
                          help="where the routes' answers go: none, or PLATFORM:CHAT_ID (default none)")
    http = setup.add_argument_group("http")
    http.add_argument("--http-host", default="127.0.0.1")
    http.add_argument("--http-port", type=int, default=8080, help="0 picks a free port at each start")
    setup.set_defaults(func=_cmd_setup)
