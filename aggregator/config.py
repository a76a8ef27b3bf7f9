"""`rankwatch serve` settings: defaults, a TOML file, then command-line flags on top.

    [serve]                 # every key optional
    data = "./rankwatch_data"
    host = "127.0.0.1"      # dashboard
    port = 8670
    ingest_host = "*"       # agents
    ingest_port = 8671
    token_env = "RANKWATCH_TOKEN"   # or token_file = "/etc/rankwatch/token", or token = "..."
    allow_hosts = ["head.example.org"]  # names the dashboard answers to ("*": any)
    public_url = "https://rankwatch.example.org/"  # the dashboard as people reach it: links
    lost_after_s = 10.0     # health: silence before a rank is lost
    min_stall_s = 30.0      # health: no new step for this long makes a rank stalled
    remote_write = "http://victoria:8428/api/v1/import/prometheus"  # off when absent
    remote_write_interval_s = 10.0

    [alerts]                # AlertConfig: disabled, severity, thresholds, plateau, ...
    [divergence]            # DivergenceConfig: z_threshold, confirm_steps, rules.<metric> ...
    [incidents]             # IncidentConfig: window_s, spread_steps, timeline_max,
                            # announce_quiet_s, announce_hold_s
    [telemetry]             # HardwareConfig: interval_s, z_threshold, confirm_buckets, ...

    [[webhooks]]
    kind = "dingtalk"       # a kind of aggregator/alerts/sinks/: json, slack, dingtalk, ...
    url_env = "DINGTALK_URL"        # or url = "..."
    secret_env = "DINGTALK_SECRET"  # or secret = "..."
    min_severity = "warning"

    [[policy]]              # incidents -> actions on the ranks (aggregator/actions/policy.py)
    on = "nonfinite"
    actions = ["checkpoint", "stop"]

Every mistake is a ``ConfigError`` naming the file and the key. See docs/alerts.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser before it joined the standard library (a server dependency on 3.10)
    # checked on 3.11, where the package is not installed: the ignore is for that environment
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

from rankwatch.aggregator.actions.policy import PolicyError, parse_rules, parse_spec
from rankwatch.aggregator.alerts.config import AlertConfig
from rankwatch.aggregator.alerts.sinks.base import describe
from rankwatch.aggregator.alerts.sinks.http import WebhookConfig
from rankwatch.aggregator.alerts.sinks.registry import kinds
from rankwatch.aggregator.divergence.detector import DivergenceConfig
from rankwatch.aggregator.incidents.tracker import IncidentConfig
from rankwatch.aggregator.service import ServeConfig
from rankwatch.aggregator.telemetry.outliers import HardwareConfig

SECTIONS = ("serve", "alerts", "divergence", "incidents", "telemetry", "webhooks", "policy")

# [serve] key -> (ServeConfig field, accepted types)
SERVE_KEYS: dict[str, tuple[str, tuple[type, ...]]] = {
    "data": ("data_dir", (str,)),
    "data_dir": ("data_dir", (str,)),
    "host": ("host", (str,)),
    "port": ("port", (int,)),
    "ingest_host": ("ingest_host", (str,)),
    "ingest_port": ("ingest_port", (int,)),
    "token": ("token", (str,)),
    "token_env": ("token", (str,)),
    "token_file": ("token", (str,)),
    "allow_hosts": ("allow_hosts", (list,)),
    "flush_interval_s": ("flush_interval_s", (int, float)),
    "lost_after_s": ("lost_after_s", (int, float)),
    "min_stall_s": ("min_stall_s", (int, float)),
    "merge_grace_s": ("merge_grace_s", (int, float)),
    "console_alerts": ("console_alerts", (bool,)),
    "resend_gaps": ("resend_gaps", (bool,)),
    "remote_write": ("remote_write", (str,)),
    "remote_write_interval_s": ("remote_write_interval_s", (int, float)),
    "public_url": ("public_url", (str,)),
}
# [incidents] key -> accepted types (IncidentConfig's fields)
INCIDENT_KEYS: dict[str, tuple[type, ...]] = {
    "window_s": (int, float),
    "spread_steps": (int,),
    "timeline_max": (int,),
    "announce_quiet_s": (int, float),
    "announce_hold_s": (int, float),
}
WEBHOOK_KEYS: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "url": (str,),
    "url_env": (str,),
    "secret": (str,),
    "secret_env": (str,),
    "name": (str,),
    "min_severity": (str,),
    "rate_per_min": (int, float),
    "timeout_s": (int, float),
    "attempts": (int,),
    "backoff_s": (int, float),
    "queue_max": (int,),
}


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the file (or flag) and the key."""


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def _type_names(types: tuple[type, ...]) -> str:
    names = {
        bool: "true/false",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
    }
    return " or ".join(names[t] for t in types if not (t is int and float in types))


def _env(where: str, name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"{where}: environment variable {name} is not set or empty")
    return value


def read_token_file(path: str | Path, where: str) -> str:
    """The token in ``path`` (its first line, without surrounding whitespace)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the token file {path}: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: the token file {path} is not UTF-8 text") from None
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise ConfigError(f"{where}: the token file {path} is empty")
    return lines[0].strip()


def load_config(path: Path | str | None = None, base: ServeConfig | None = None) -> ServeConfig:
    """Defaults, then ``path`` (TOML) when given."""
    config = base or ServeConfig()
    if path is None:
        return config
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(raw, str(path), config)


def parse_config(raw: Mapping[str, Any], where: str, base: ServeConfig) -> ServeConfig:
    """Apply a parsed TOML document to ``base``; ``where`` names the source in errors."""
    for section in raw:
        if section not in SECTIONS:
            raise ConfigError(
                f"{where}: unknown section or key '{section}'; known: {', '.join(SECTIONS)}"
            )
    changes: dict[str, Any] = {}
    serve = raw.get("serve", {})
    if not isinstance(serve, Mapping):
        raise ConfigError(f"{where}: 'serve' must be a table ([serve])")
    for key, value in serve.items():
        if key not in SERVE_KEYS:
            raise ConfigError(
                f"{where}: unknown key 'serve.{key}'; known: {', '.join(sorted(SERVE_KEYS))}"
            )
        field, types = SERVE_KEYS[key]
        if not _type_ok(value, types):
            raise ConfigError(f"{where}: 'serve.{key}' must be {_type_names(types)}, got {value!r}")
        if key == "token_env":
            value = _env(f"{where}: 'serve.token_env'", value)
        elif key == "token_file":
            value = read_token_file(value, f"{where}: 'serve.token_file'")
        elif key == "allow_hosts":
            if not all(isinstance(h, str) and h.strip() for h in value):
                raise ConfigError(f"{where}: 'serve.allow_hosts' must be a list of host names")
            value = tuple(value)
        elif field == "data_dir":
            value = Path(value).expanduser()
        changes[field] = value
    sections: tuple[tuple[str, Any], ...] = (
        ("alerts", AlertConfig), ("divergence", DivergenceConfig), ("telemetry", HardwareConfig),
    )  # fmt: skip
    for section, cls in sections:
        table = raw.get(section)
        if table is None:
            continue
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: '{section}' must be a table ([{section}])")
        try:
            changes[section] = cls.from_dict(table)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: [{section}] {exc}") from None
    if "incidents" in raw:
        changes["incidents"] = _incidents(raw["incidents"], where)
    hooks = raw.get("webhooks")
    if hooks is not None:
        if not isinstance(hooks, list) or not all(isinstance(h, Mapping) for h in hooks):
            raise ConfigError(f"{where}: 'webhooks' must be an array of tables ([[webhooks]])")
        changes["webhooks"] = [
            *base.webhooks,
            *(_webhook(h, f"{where}: webhooks[{i}]") for i, h in enumerate(hooks)),
        ]
    if "policy" in raw:
        try:
            changes["policies"] = (*base.policies, *parse_rules(raw["policy"], where))
        except PolicyError as exc:
            raise ConfigError(str(exc)) from None
    config = dataclasses.replace(base, **changes)
    check(config, where)
    return config


def _incidents(table: Any, where: str) -> IncidentConfig:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: 'incidents' must be a table ([incidents])")
    for key, value in table.items():
        if key not in INCIDENT_KEYS:
            raise ConfigError(
                f"{where}: unknown key 'incidents.{key}'; known: {', '.join(INCIDENT_KEYS)}"
            )
        if not _type_ok(value, INCIDENT_KEYS[key]):
            raise ConfigError(
                f"{where}: 'incidents.{key}' must be {_type_names(INCIDENT_KEYS[key])}, "
                f"got {value!r}"
            )
    try:
        return IncidentConfig(**table)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def public_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the dashboard's public address, or None when it can."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        return f"it does not parse ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "it must start with http:// or https:// and name a host"
    if any(c.isspace() for c in url):
        return "it contains a space"
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        return "it must not have a ?query or #fragment: the links add the dashboard's own"
    return None


def _webhook(table: Mapping[str, Any], where: str) -> WebhookConfig:
    kw: dict[str, Any] = {}
    for key, value in table.items():
        if key not in WEBHOOK_KEYS:
            raise ConfigError(
                f"{where}: unknown key '{key}'; known: {', '.join(sorted(WEBHOOK_KEYS))}"
            )
        if not _type_ok(value, WEBHOOK_KEYS[key]):
            raise ConfigError(
                f"{where}: '{key}' must be {_type_names(WEBHOOK_KEYS[key])}, got {value!r}"
            )
        if key.endswith("_env"):
            kw[key[:-4]] = _env(f"{where}: '{key}'", value)
        else:
            kw[key] = value
    for needed in ("kind", "url"):
        if needed not in kw:
            raise ConfigError(f"{where}: '{needed}' is missing")
    try:
        return WebhookConfig(**kw)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_webhook_flag(text: str) -> WebhookConfig:
    """``--webhook KIND=URL`` (secrets belong in the config file or its *_env keys)."""
    kind, sep, url = text.partition("=")
    if not sep or not kind or not url:
        raise ConfigError(
            f"--webhook expects KIND=URL with KIND one of {describe(kinds())}, "
            f"got {text.split('=')[0]!r}=..."
        )
    try:
        return WebhookConfig(kind.strip(), url.strip())
    except ValueError as exc:
        raise ConfigError(f"--webhook: {exc}") from None


def with_overrides(
    config: ServeConfig,
    *,
    data: str | Path | None = None,
    host: str | None = None,
    port: int | None = None,
    ingest_host: str | None = None,
    ingest_port: int | None = None,
    token: str | None = None,
    allow_hosts: Sequence[str] = (),
    webhooks: Sequence[str] = (),
    min_stall_s: float | None = None,
    remote_write: str | None = None,
    public_url: str | None = None,
    policies: Sequence[str] = (),
) -> ServeConfig:
    """Command-line flags over the file: only flags actually given (not None) change it."""
    changes: dict[str, Any] = {
        name: value
        for name, value in (
            ("host", host),
            ("port", port),
            ("ingest_host", ingest_host),
            ("ingest_port", ingest_port),
            ("token", token),
            ("min_stall_s", min_stall_s),
            ("remote_write", remote_write),
            ("public_url", public_url),
        )
        if value is not None
    }
    if public_url is not None and (problem := public_url_problem(public_url)):
        raise ConfigError(f"--public-url {bad_public_url(public_url, problem)}")
    if data is not None:
        changes["data_dir"] = Path(data).expanduser()
    if allow_hosts:
        changes["allow_hosts"] = (*config.allow_hosts, *allow_hosts)
    if webhooks:
        changes["webhooks"] = [*config.webhooks, *(parse_webhook_flag(w) for w in webhooks)]
    if policies:
        try:
            rules = [rule for spec in policies for rule in parse_spec(spec)]
        except PolicyError as exc:
            raise ConfigError(str(exc)) from None
        changes["policies"] = (*config.policies, *rules)
    config = dataclasses.replace(config, **changes)
    check(config, "command line")
    return config


def check(config: ServeConfig, where: str) -> None:
    for name in ("port", "ingest_port"):
        value = getattr(config, name)
        if not 0 <= value <= 65535:
            raise ConfigError(f"{where}: {name} {value} is not a TCP port (0-65535)")
    for name in ("flush_interval_s", "lost_after_s", "min_stall_s", "remote_write_interval_s"):
        if not getattr(config, name) > 0:
            raise ConfigError(f"{where}: {name} must be > 0 seconds")
    if config.merge_grace_s < 0:
        raise ConfigError(f"{where}: merge_grace_s must be >= 0 seconds")
    if config.token is not None and not config.token.strip():
        raise ConfigError(f"{where}: token is empty")
    if config.remote_write is not None:
        parts = urllib.parse.urlsplit(config.remote_write)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"{where}: remote_write {config.remote_write!r} is not an http(s) URL with a "
                "host, e.g. http://victoria:8428/api/v1/import/prometheus"
            )
    if config.public_url is not None and (problem := public_url_problem(config.public_url)):
        bad = bad_public_url(config.public_url, problem)
        raise ConfigError(f"{where}: 'serve.public_url' {bad}")


def bad_public_url(url: str, problem: str) -> str:
    return (
        f"{url!r} is not the dashboard's address: {problem} (like https://rankwatch.example.org/ "
        "or http://head-node:8670)"
    )
