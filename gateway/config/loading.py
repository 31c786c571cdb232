"""Reading the YAML file and turning it into a validated :class:`Config` (or, for admin commands, only the
part they read: :class:`StoreConfig`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from gateway.config.base import _Context
from gateway.config.errors import ConfigError, from_validation_error
from gateway.config.interpolation import interpolate
from gateway.config.root import STORE_CONFIG_KEYS, Config, StoreConfig, _Root


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_R = TypeVar("_R", bound=_Root)


def _yaml_error(file: Path, exc: yaml.YAMLError) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return ConfigError("", f"{file}: invalid YAML{where}: {problem}", "check indentation and quoting there")


def _validate(model: type[_R], data: Mapping[str, Any], env: Mapping[str, str] | None, base_dir: Path,
              source: Path | None = None) -> _R:
    env = os.environ if env is None else env
    errors: list[ConfigError] = []
    resolved = interpolate(data, env, (), errors)
    if errors:
        raise ConfigError.combine(errors)
    try:
        config = model.model_validate(resolved, context=_Context(env, base_dir))
    except ValidationError as exc:
        raise from_validation_error(exc, model) from None
    config._source = source
    return config


def _read(file: Path) -> Mapping[str, Any]:
    """The parsed top-level mapping of a YAML config file."""
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"config file not found: {file}",
                          "pass --config PATH, or start from deploy/config.example.yaml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read config file {file}: {exc}") from None
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise _yaml_error(file, exc) from None
    if data is None:  # an empty file (or only comments)
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError("", f"{file}: the top level must be a mapping of sections, not {type(data).__name__}",
                          "start with a section name such as 'model:'")
    return data


def parse_config(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """Validate already-parsed config data; ``${VAR}`` in string values is resolved from ``env``.

    Relative paths are resolved against the current directory.
    """
    return _validate(Config, data, env, Path.cwd())


def default_config(env: Mapping[str, str] | None = None) -> Config:
    """The configuration with every default (home-relative paths follow ``env``)."""
    return parse_config({}, env)


def load_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> Config:
    """Load and validate a YAML config file (None: all defaults); ``env`` defaults to os.environ.

    Relative paths in the file are resolved against the file's directory; ``Config.source`` is the file.
    """
    if path is None:
        return default_config(env)
    file = Path(path).expanduser().absolute()
    return _validate(Config, _read(file), env, file.parent, file)


def _store_part(data: Mapping[str, Any]) -> dict[str, Any]:
    """The sections and keys of ``STORE_CONFIG_KEYS`` found in ``data``."""
    part: dict[str, Any] = {}
    for section, keys in STORE_CONFIG_KEYS.items():
        if section not in data:
            continue
        value = data[section]
        # A section that is not a mapping is passed on whole, to be reported as such.
        part[section] = value if keys is None or not isinstance(value, Mapping) else {
            key: value[key] for key in keys if key in value}
    return part


def load_store_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> StoreConfig:
    """Load and validate only what admin commands read (see :class:`StoreConfig`): ``${VAR}`` is resolved
    there only, so a secret the rest of the file refers to need not be set. None: all defaults."""
    if path is None:
        return _validate(StoreConfig, {}, env, Path.cwd())
    file = Path(path).expanduser().absolute()
    return _validate(StoreConfig, _store_part(_read(file)), env, file.parent, file)
