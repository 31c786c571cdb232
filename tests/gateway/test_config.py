"""Config loading: defaults, the example file, interpolation, validation errors, secrets masking."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from gateway.config import (
    Config,
    ConfigError,
    StoreSettings,
    default_config,
    gateway_home,
    load_config,
    parse_config,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"
EXAMPLE_ENV = {
    "OPENAI_API_KEY": "sk-example-key",
    "GITHUB_WEBHOOK_SECRET": "gh-example-secret",
    "DEPLOY_WEBHOOK_SECRET": "deploy-example-secret",
    "GITLAB_WEBHOOK_TOKEN": "gitlab-example-token",
    "OPS_CALLBACK_SECRET": "ops-example-secret",
    "TELEGRAM_BOT_TOKEN": "123456:example-bot-token",
}
HOME_ENV = {"HERMES_GATEWAY_HOME": "/srv/hermes"}


def _route(**fields: Any) -> dict[str, Any]:
    return {"secret": "route-secret", "prompt": "Event {payload.type}", **fields}


def _with_routes(routes: dict[str, Any], **webhook: Any) -> dict[str, Any]:
    return {"platforms": {"webhook": {"routes": routes, **webhook}}}


def _error(data: dict[str, Any], env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env or {})
    return info.value


def _write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and files --------------------------------------------------------------------------

def test_defaults_load_without_a_file() -> None:
    config = load_config(None, HOME_ENV)
    assert config.model.base_url == "https://api.openai.com/v1"
    assert config.model.api_key.get_secret_value() == ""
    assert config.model.max_turns == 10
    assert config.http.port == 8080
    assert config.http.api_token is None
    assert config.gateway.busy == "queue"
    assert config.platforms.webhook.allowed_toolsets == ["hermes-webhook"]
    assert config.platforms.webhook.routes == {}
    assert config.cron.timezone == "UTC"
    assert config.logging.level == "INFO"
    assert config == default_config(HOME_ENV)


def test_home_directory_follows_env() -> None:
    config = default_config(HOME_ENV)
    assert config.store.url == "sqlite:////srv/hermes/state.db"
    assert config.gateway.workspace == Path("/srv/hermes/workspace")
    assert gateway_home({}) == Path("~/.hermes-gateway").expanduser()


def test_example_file_loads_and_documents_every_key() -> None:
    config = load_config(EXAMPLE, EXAMPLE_ENV)
    assert config.model.api_key.get_secret_value() == "sk-example-key"
    routes = config.platforms.webhook.routes
    assert routes["github"].secrets() == ["gh-example-secret"]
    # The unset optional rotation secret is dropped from the list.
    assert routes["deploys"].secrets() == ["deploy-example-secret"]
    assert routes["deploys"].delivery == ("callback", "ops", None)
    assert config.auth.platforms["telegram"].allowed_users == ["123456789"]

    text = EXAMPLE.read_text(encoding="utf-8")
    undocumented = [name for name in _field_names(Config)
                    if not re.search(rf"^\s*(# )?{name}:", text, re.MULTILINE)]
    assert undocumented == []


def _field_names(model: type[BaseModel]) -> Iterator[str]:
    for name, field in model.model_fields.items():
        yield name
        for tp in (field.annotation, *get_args(field.annotation)):
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                yield from _field_names(tp)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found") as info:
        load_config(tmp_path / "nope.yaml", {})
    assert info.value.path == ""


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "model:\n  name: x\n  bad: [unclosed\nhttp: {}\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+"):
        load_config(path, {})


def test_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, "http:\n  port: 1\nhttp:\n  port: 2\n")
    with pytest.raises(ConfigError, match=r"line 3.*duplicate key 'http'"):
        load_config(path, {})


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- model\n- http\n"), {})


def test_empty_file_means_defaults_and_remembers_its_source(tmp_path: Path) -> None:
    loaded = load_config(_write(tmp_path, "# nothing yet\n"), HOME_ENV)
    assert loaded.model_dump() == default_config(HOME_ENV).model_dump()
    assert loaded.source == (tmp_path / "config.yaml").absolute() and default_config(HOME_ENV).source is None


# --- interpolation -------------------------------------------------------------------------------

def test_interpolation_of_set_variable() -> None:
    config = parse_config({"model": {"api_key": "${KEY}", "name": "m-${SUFFIX}"}}, {"KEY": "k", "SUFFIX": "1"})
    assert config.model.api_key.get_secret_value() == "k"
    assert config.model.name == "m-1"


def test_whole_value_reference_is_coerced_by_the_field_type() -> None:
    config = parse_config({"http": {"port": "${PORT}"}, "model": {"stream": "${STREAM}"}},
                          {"PORT": "9000", "STREAM": "false"})
    assert config.http.port == 9000
    assert config.model.stream is False


def test_unset_variable_names_the_key_path() -> None:
    err = _error({"model": {"api_key": "${OPENAI_API_KEY}"}})
    assert str(err) == ("model.api_key: environment variable OPENAI_API_KEY is not set "
                        "(export it, or write ${OPENAI_API_KEY:-default})")
    assert err.path == "model.api_key"


def test_unset_variable_in_a_list_names_the_index() -> None:
    err = _error(_with_routes({"gh": _route(secret=["${NEW}", "${OLD}"])}), {"NEW": "n"})
    assert err.path == "platforms.webhook.routes.gh.secret[1]"


def test_default_when_unset_or_empty() -> None:
    data = {"model": {"name": "${MODEL:-gpt-x}"}}
    assert parse_config(data, {}).model.name == "gpt-x"
    assert parse_config(data, {"MODEL": ""}).model.name == "gpt-x"
    assert parse_config(data, {"MODEL": "llama"}).model.name == "llama"


def test_set_but_empty_variable_without_default_is_empty() -> None:
    assert parse_config({"model": {"api_key": "${KEY}"}}, {"KEY": ""}).model.api_key.get_secret_value() == ""


def test_dollar_dollar_escapes() -> None:
    config = parse_config({"model": {"name": "$${NOT_A_VAR} costs $$5 and $x"}}, {})
    assert config.model.name == "${NOT_A_VAR} costs $5 and $x"


@pytest.mark.parametrize("value", ["${", "x${UNCLOSED", "${}", "${1BAD}", "${A:default}", "${A:-${B}}"])
def test_malformed_reference(value: str) -> None:
    err = _error({"model": {"name": value}}, {"A": "a", "B": "b"})
    assert err.path == "model.name"
    assert "malformed" in err.message
    assert "$$" in err.hint


def test_malformed_reference_in_a_secret_is_not_echoed() -> None:
    err = _error({"model": {"api_key": "abc${hunter2"}})
    assert "hunter2" not in str(err)


def test_keys_are_not_interpolated() -> None:
    err = _error({"toolsets": {"${PLATFORM}": "web"}}, {"PLATFORM": "slack"})
    assert err.path == "toolsets.${PLATFORM}"


def test_several_interpolation_errors_are_reported_together() -> None:
    err = _error({"model": {"api_key": "${A}", "name": "${B}"}})
    assert [e.path for e in err.errors] == ["model.api_key", "model.name"]


_DOLLAR_TEXT = st.text(alphabet=st.sampled_from("${}:-_AZaz09 x"), max_size=30) | st.text(max_size=30)
_ENV = st.dictionaries(st.text(alphabet="AB_x1", min_size=1, max_size=3), st.text(max_size=8), max_size=4)


@given(text=_DOLLAR_TEXT, env=_ENV)
def test_interpolation_only_ever_raises_config_error(text: str, env: dict[str, str]) -> None:
    try:
        config = parse_config({"model": {"name": text}}, env)
    except ConfigError as err:
        assert err.path == "model.name"
    else:
        if "$" not in text:
            assert config.model.name == text


@given(text=st.text(max_size=30), env=_ENV)
def test_doubled_dollars_round_trip(text: str, env: dict[str, str]) -> None:
    assert parse_config({"model": {"name": text.replace("$", "$$")}}, env).model.name == text


# --- validation errors ---------------------------------------------------------------------------

def test_unknown_key_with_suggestion() -> None:
    err = _error({"gateway": {"bussy": "queue"}})
    assert err.path == "gateway.bussy"
    assert err.message == "unknown key"
    assert "did you mean 'busy'?" in err.hint
    assert "allowed: admission, agent_workers, busy, drain_timeout, group_sessions_per_user" in err.hint


def test_unknown_top_level_key() -> None:
    err = _error({"modle": {}})
    assert str(err).startswith("modle: unknown key (did you mean 'model'?")


def test_unknown_nested_route_key() -> None:
    err = _error(_with_routes({"gh": _route(scret="x")}))
    assert err.path == "platforms.webhook.routes.gh.scret"
    assert "did you mean 'secret'?" in err.hint


def test_unknown_platform_is_rejected() -> None:
    assert _error({"platforms": {"matrix": {}}}).path == "platforms.matrix"


def test_missing_route_secret_is_required() -> None:
    err = _error(_with_routes({"gh": {"prompt": "p"}}))
    assert str(err) == "platforms.webhook.routes.gh.secret: required"


def test_empty_route_secret() -> None:
    assert _error(_with_routes({"gh": _route(secret="")})).message == "must not be empty"
    assert "at least one" in _error(_with_routes({"gh": _route(secret=["", ""])})).message


def test_route_secret_of_wrong_type_gives_one_error() -> None:
    err = _error(_with_routes({"gh": _route(secret=5)}))
    assert str(err) == "platforms.webhook.routes.gh.secret: must be a string or a list of strings"


def test_route_secret_rotation() -> None:
    config = parse_config(_with_routes({"gh": _route(secret=["new", "old"])}), {})
    assert config.platforms.webhook.routes["gh"].secrets() == ["new", "old"]


def test_bad_type_names_the_path() -> None:
    err = _error({"http": {"port": "abc"}})
    assert err.path == "http.port"
    assert "valid integer" in err.message
    assert err.hint == "got 'abc'"


def test_bad_type_of_a_secret_does_not_echo_it() -> None:
    err = _error({"http": {"api_token": 123456789}})
    assert err.path == "http.api_token"
    assert "123456789" not in str(err)


def test_section_that_is_not_a_mapping() -> None:
    assert str(_error({"model": None})) == "model: must be a mapping (it is empty: add its keys, or remove it)"
    assert str(_error({"http": [1]})) == "http: must be a mapping (got a list)"


@pytest.mark.parametrize(("data", "path"), [
    ({"http": {"port": 70000}}, "http.port"),
    ({"model": {"max_turns": 0}}, "model.max_turns"),
    ({"model": {"timeout": 0}}, "model.timeout"),
    ({"tool_search": {"threshold": 1.5}}, "tool_search.threshold"),
    ({"gateway": {"busy": "drop"}}, "gateway.busy"),
    ({"logging": {"format": "xml"}}, "logging.format"),
])
def test_range_and_choice_errors(data: dict[str, Any], path: str) -> None:
    assert _error(data).path == path


def test_several_errors_are_listed_together() -> None:
    err = _error({"http": {"port": "abc"}, "gateway": {"bussy": 1}, "cron": {"timezone": "Mars/Base"}})
    assert sorted(e.path for e in err.errors) == ["cron.timezone", "gateway.bussy", "http.port"]
    lines = str(err).splitlines()
    assert len(lines) == 3
    assert all(any(line.startswith(f"{e.path}: ") for line in lines) for e in err.errors)


def test_single_error_lists_itself() -> None:
    err = _error({"http": {"port": "abc"}})
    assert err.errors == [err]


def test_log_level_is_case_insensitive() -> None:
    assert parse_config({"logging": {"level": "debug"}}, {}).logging.level == "DEBUG"


# --- webhook routes ------------------------------------------------------------------------------

def test_route_toolset_widening_is_rejected() -> None:
    err = _error(_with_routes({"gh": _route(toolset="debugging")}))
    assert err.path == "platforms.webhook.routes.gh.toolset"
    assert err.message.startswith("widens beyond platforms.webhook.allowed_toolsets (extra tools: terminal,")


def test_route_toolset_all_widens() -> None:
    err = _error(_with_routes({"gh": _route(toolset=["web", "all"])}))
    assert "every tool" in err.message


def test_route_toolset_within_allowed() -> None:
    data = _with_routes({"gh": _route(toolset=["web", "terminal"])}, allowed_toolsets=["debugging"])
    assert parse_config(data, {}).platforms.webhook.routes["gh"].toolset == ["web", "terminal"]


def test_unknown_route_toolset() -> None:
    err = _error(_with_routes({"gh": _route(toolset=["web", "webz"])}))
    assert err.path == "platforms.webhook.routes.gh.toolset[1]"
    assert "did you mean 'web'?" in err.hint


def test_unknown_allowed_toolset() -> None:
    assert _error(_with_routes({}, allowed_toolsets=["nope"])).path == "platforms.webhook.allowed_toolsets[0]"


def test_invalid_route_name() -> None:
    err = _error(_with_routes({"has space": _route()}))
    assert err.path == "platforms.webhook.routes.has space"
    assert err.message == "invalid route name"


@pytest.mark.parametrize(("deliver_to", "delivery"), [
    ("none", None),
    ("telegram:-100123", ("telegram", "-100123", None)),
    ("slack:C123:1700000000.000100", ("slack", "C123", "1700000000.000100")),
])
def test_deliver_to_forms(deliver_to: str, delivery: tuple[str, str, str | None] | None) -> None:
    config = parse_config(_with_routes({"gh": _route(deliver_to=deliver_to)}), {})
    assert config.platforms.webhook.routes["gh"].delivery == delivery


@pytest.mark.parametrize(("deliver_to", "message"), [
    ("telegram", "invalid delivery target"),
    ("telegram:", "invalid delivery target"),
    ("discord:1:2:3", "invalid delivery target"),
    ("irc:#chan", "unknown delivery platform 'irc'"),
    ("callback:ops:thread", "a callback target takes no thread id"),
])
def test_deliver_to_format_errors(deliver_to: str, message: str) -> None:
    err = _error(_with_routes({"gh": _route(deliver_to=deliver_to)}))
    assert err.path == "platforms.webhook.routes.gh.deliver_to"
    assert err.message.startswith(message)
    assert err.hint


def test_deliver_to_unknown_callback_target() -> None:
    data = _with_routes({"gh": _route(deliver_to="callback:opz")})
    data["platforms"]["callback"] = {"targets": {"ops": {"url": "https://ops.example.com", "secret": "s"}}}
    err = _error(data)
    assert err.path == "platforms.webhook.routes.gh.deliver_to"
    assert err.message == "unknown callback target 'opz'"
    assert "defined: ops" in err.hint


def test_callback_target_validation() -> None:
    err = _error({"platforms": {"callback": {"targets": {"ops": {"url": "ftp://x", "secret": ""}}}}})
    assert [e.path for e in err.errors] == ["platforms.callback.targets.ops.url",
                                           "platforms.callback.targets.ops.secret"]


# --- other sections ------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["sqlite:////var/lib/h/state.db", "sqlite+aiosqlite:////var/lib/h/state.db",
                                 "sqlite:///:memory:", "postgresql://u:p@db/hermes", "postgresql+asyncpg://u:p@db/hermes"])
def test_store_url_forms(url: str) -> None:
    assert parse_config({"store": {"url": url}}, {}).store.url == url


@pytest.mark.parametrize("scheme", ["sqlite", "sqlite+aiosqlite"])
def test_relative_sqlite_store_is_beside_the_config_file_not_in_the_cwd(
        tmp_path: Path, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "elsewhere").mkdir()
    config = _write(tmp_path / "etc", f"store:\n  url: {scheme}:///data/state.db?timeout=5\n")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_config(config, {}).store.url == f"{scheme}:///{tmp_path}/etc/data/state.db?timeout=5"


@pytest.mark.parametrize("url", ["mysql://u:hunter2@db/x", "postgres://u:hunter2@db/x", "state.db", "sqlite://"])
def test_unsupported_store_url(url: str) -> None:
    err = _error({"store": {"url": url}})
    assert err.path == "store.url"
    assert "hunter2" not in str(err)
    assert "sqlite:///" in err.hint


def test_store_url_default_without_loader() -> None:
    assert StoreSettings().url.endswith("/state.db")


def test_invalid_timezone() -> None:
    err = _error({"cron": {"timezone": "Europe/Berln"}})
    assert err.path == "cron.timezone"
    assert "did you mean 'Europe/Berlin'?" in err.hint
    assert "such as 'Europe/Berlin'" in err.hint
    assert _error({"cron": {"timezone": "../../etc/passwd"}}).path == "cron.timezone"


def test_toolset_overrides() -> None:
    config = parse_config({"toolsets": {"slack": ["safe", "mcp-github", "plugin-x"], "cron": "hermes-cron"}}, {})
    assert config.toolsets["slack"] == ["safe", "mcp-github", "plugin-x"]
    assert _error({"toolsets": {"telgram": "web"}}).hint.startswith("did you mean 'telegram'?")
    assert _error({"toolsets": {"slack": ["safe", "unsafe"]}}).path == "toolsets.slack[1]"


def test_auth() -> None:
    config = parse_config({"auth": {"admins": ["telegram:1"],
                                    "platforms": {"telegram": {"allowed_users": [42], "allowed_chats": [-100]}}}}, {})
    assert config.auth.platforms["telegram"].allowed_users == ["42"]
    assert config.auth.platforms["telegram"].allowed_chats == ["-100"]
    assert _error({"auth": {"admins": ["irc:1"]}}).path == "auth.admins[0]"
    assert _error({"auth": {"platforms": {"webhook": {}}}}).path == "auth.platforms.webhook"


def test_private_networks() -> None:
    networks = ["10.0.0.0/8", "fd00::/8"]
    assert parse_config({"web": {"allow_private_networks": networks}}, {}).web.allow_private_networks == networks
    err = _error({"web": {"allow_private_networks": ["10.0.0.1/8", "nope"]}})
    assert [e.path for e in err.errors] == ["web.allow_private_networks[0]", "web.allow_private_networks[1]"]
    assert err.errors[0].hint == "write 10.0.0.0/8"


def test_system_prompt_file_is_read_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "system.md").write_text("Be brief.", encoding="utf-8")
    config = load_config(_write(tmp_path, "model:\n  system_prompt_file: prompts/system.md\n"), {})
    assert config.model.system_prompt == "Be brief."
    assert config.model.system_prompt_file == tmp_path / "prompts" / "system.md"


def test_system_prompt_file_missing(tmp_path: Path) -> None:
    err = _error({"model": {"system_prompt_file": str(tmp_path / "nope.md")}})
    assert err.path == "model.system_prompt_file"
    assert err.message.startswith("file not found")


def test_system_prompt_and_file_together(tmp_path: Path) -> None:
    prompt = tmp_path / "p.md"
    prompt.write_text("x", encoding="utf-8")
    err = _error({"model": {"system_prompt": "inline", "system_prompt_file": str(prompt)}})
    assert err.path == "model.system_prompt_file"
    assert "together with model.system_prompt" in err.message


def test_relative_workspace_resolves_against_the_config_file(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "gateway:\n  workspace: ws\n"), {})
    assert config.gateway.workspace == tmp_path / "ws"


# --- secrets -------------------------------------------------------------------------------------

_SECRETS = {"OPENAI_API_KEY": "sk-live-abc", "HERMES_API_TOKEN": "tok-xyz", "GITHUB_WEBHOOK_SECRET": "gh-1",
            "DEPLOY_WEBHOOK_SECRET": "dep-new", "DEPLOY_WEBHOOK_SECRET_PREVIOUS": "dep-old",
            "GITLAB_WEBHOOK_TOKEN": "gl-1",
            "OPS_CALLBACK_SECRET": "ops-2", "HERMES_STORE_URL": "postgresql://hermes:pg%40pw@db/hermes",
            "TELEGRAM_BOT_TOKEN": "123456:tg-secret"}


def test_masked_hides_every_secret() -> None:
    config = load_config(EXAMPLE, _SECRETS)
    masked = config.masked()
    dumped = json.dumps(masked)
    for secret in (*_SECRETS.values(), "pg%40pw", "pg@pw"):
        assert secret not in dumped
    assert masked["model"]["api_key"] == "***"
    assert masked["http"]["api_token"] == "***"
    assert masked["platforms"]["webhook"]["routes"]["deploys"]["secret"] == ["***", "***"]
    assert masked["platforms"]["callback"]["targets"]["ops"]["secret"] == "***"
    assert masked["store"]["url"] == "postgresql://hermes:***@db/hermes"
    assert masked["gateway"]["workspace"] == "/var/lib/hermes-gateway/workspace"


def test_masked_shows_empty_secrets_as_null() -> None:
    masked = default_config({}).masked()
    assert masked["model"]["api_key"] is None
    assert masked["http"]["api_token"] is None


def test_empty_api_token_means_none() -> None:
    assert parse_config({"http": {"api_token": "${T:-}"}}, {}).http.api_token is None


def test_secret_values() -> None:
    config = load_config(EXAMPLE, _SECRETS)
    assert set(config.secret_values()) == {"sk-live-abc", "tok-xyz", "gh-1", "dep-new", "dep-old", "ops-2",
                                           "gl-1", "pg%40pw", "pg@pw", "123456:tg-secret"}
    assert default_config({}).secret_values() == []
