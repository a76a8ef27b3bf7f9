"""Config: TOML file over defaults, flags over the file, clear errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from rankwatch.aggregator.config import (
    ConfigError,
    load_config,
    parse_webhook_flag,
    with_overrides,
)
from rankwatch.aggregator.service import ServeConfig


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rankwatch.toml"
    path.write_text(text)
    return path


def test_no_file_gives_useful_defaults() -> None:
    cfg = load_config(None)
    assert cfg == ServeConfig()
    assert (cfg.host, cfg.port, cfg.ingest_host, cfg.ingest_port) == ("127.0.0.1", 8670, "*", 8671)
    assert cfg.data_dir == Path("rankwatch_data") and cfg.token is None and cfg.webhooks == []
    assert cfg.alerts.enabled("divergence") and cfg.divergence.z_threshold > 0


def test_a_full_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RW_TOKEN", "s3cret")
    monkeypatch.setenv("DING_URL", "https://oapi.dingtalk.com/robot/send?access_token=abc")
    monkeypatch.setenv("DING_SECRET", "SECxyz")
    path = write(
        tmp_path,
        """
        [serve]
        data = "/srv/rw"
        port = 9000
        ingest_port = 9001
        token_env = "RW_TOKEN"
        lost_after_s = 30
        console_alerts = false

        [alerts]
        disabled = ["plateau"]
        severity = { straggler = "critical" }
        thresholds = [{ metric = "loss", op = ">", value = 10.0 }]

        [divergence]
        z_threshold = 4.0
        evidence_per_doubling = 0
        rules.grad_norm = { direction = "high" }

        [[webhooks]]
        kind = "dingtalk"
        url_env = "DING_URL"
        secret_env = "DING_SECRET"
        min_severity = "warning"

        [[webhooks]]
        kind = "lark"
        url = "https://open.feishu.cn/open-apis/bot/v2/hook/x"
        rate_per_min = 5
        """,
    )
    cfg = load_config(path)
    assert cfg.data_dir == Path("/srv/rw") and (cfg.port, cfg.ingest_port) == (9000, 9001)
    assert cfg.token == "s3cret" and cfg.lost_after_s == 30 and not cfg.console_alerts
    assert not cfg.alerts.enabled("plateau") and cfg.alerts.severity_of("straggler") == "critical"
    assert cfg.alerts.thresholds[0].metric == "loss"
    assert cfg.divergence.z_threshold == 4.0
    assert cfg.divergence.limit_for(4_096) == cfg.divergence.evidence_limit
    assert cfg.divergence.rule("grad_norm").direction == "high"
    ding, lark = cfg.webhooks
    assert ding.kind == "dingtalk" and ding.secret == "SECxyz" and ding.min_severity == "warning"
    assert lark.kind == "feishu" and lark.rate_per_min == 5
    assert "s3cret" not in repr(cfg) and "abc" not in repr(cfg.webhooks)


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[serve]\nport = 9000\nhost = "0.0.0.0"\n')
    cfg = with_overrides(
        load_config(path), port=9100, data="x", webhooks=["slack=https://hooks.slack.com/a"]
    )
    assert (cfg.port, cfg.host, cfg.data_dir) == (9100, "0.0.0.0", Path("x"))
    assert [w.kind for w in cfg.webhooks] == ["slack"]
    assert with_overrides(cfg) == cfg  # flags not given change nothing


BAD_FILES = [
    ("[serve]\nprot = 1\n", "unknown key 'serve.prot'"),
    ("[serve]\nport = '8670'\n", "'serve.port' must be an integer"),
    ("[serve]\nport = 70000\n", "port 70000 is not a TCP port"),
    ("[serve]\nconsole_alerts = 1\n", "'serve.console_alerts' must be true/false"),
    ("[serve]\nlost_after_s = 0\n", "lost_after_s must be > 0"),
    ("[serve]\nmin_stall_s = -1\n", "min_stall_s must be > 0"),
    ("[serve]\nmin_stall_s = '5'\n", "'serve.min_stall_s' must be a number"),
    ("[serve]\ntoken_env = 'RW_NOT_SET_ANYWHERE'\n", "RW_NOT_SET_ANYWHERE is not set"),
    ("[sever]\nport = 1\n", "unknown section or key 'sever'"),
    ("serve = 3\n", "'serve' must be a table"),
    ("[alerts]\ngroup_rank = 3\n", "[alerts]"),
    ("[alerts]\ndisabled = ['nope']\n", "'nope' is not one of"),
    ("[divergence]\nz_threshld = 3\n", "unknown divergence setting 'z_threshld'"),
    ("[divergence]\nz_threshold = -1\n", "z_threshold=-1 is out of range"),
    ("[divergence]\nevidence_per_doubling = -0.5\n", "evidence_per_doubling=-0.5 is out of"),
    ("[divergence]\nevidence_ranks = 8.5\n", "'evidence_ranks' must be an integer"),
    ("[[webhooks]]\nkind = 'slack'\n", "webhooks[0]: 'url' is missing"),
    ("[[webhooks]]\nkind = 'teams'\nurl = 'https://x.y/z'\n", "unknown webhook kind 'teams'"),
    ("[[webhooks]]\nkind = 'slack'\nurl = 'https://x.y/z'\nretries = 3\n", "unknown key 'retries'"),
    ("[[webhooks]]\nkind = 'slack'\nurl = 'https://x.y/z'\nattempts = 'x'\n", "'attempts' must"),
    ("webhooks = 'https://x.y'\n", "array of tables"),
    ("[serve\nport = 1\n", "not valid TOML"),
    ("[serve]\npublic_url = 'rw.example.org'\n",
     "'serve.public_url' 'rw.example.org' is not the dashboard's address: it must start with "
     "http:// or https:// and name a host"),
    ("[serve]\npublic_url = 'https://rw.example.org/?x=1'\n", "must not have a ?query"),
    ("[serve]\npublic_url = 'https://rw.example.org:99999/'\n", "it does not parse"),
    ("[incidents]\nwindow = 30\n",
     "unknown key 'incidents.window'; known: window_s, spread_steps, timeline_max, "
     "announce_quiet_s, announce_hold_s"),
    ("[incidents]\nannounce_hold_s = -1\n", "incidents.announce_hold_s must be a number of "
     "seconds >= 0, got -1"),
    ("[incidents]\nwindow_s = 0\n", "incidents.window_s must be a positive number, got 0"),
    ("[incidents]\nwindow_s = 'long'\n", "'incidents.window_s' must be a number"),
    ("[incidents]\nspread_steps = -1\n", "incidents.spread_steps must be >= 0"),
    ("[incidents]\nspread_steps = 1.5\n", "'incidents.spread_steps' must be an integer"),
    ("[incidents]\ntimeline_max = 0\n", "incidents.timeline_max must be >= 1"),
    ("incidents = 3\n", "'incidents' must be a table"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_bad_files_name_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/rankwatch.toml")


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("slack", "KIND=URL"),
        ("=https://x.y", "KIND=URL"),
        ("teams=https://x.y/z", "unknown webhook kind 'teams'"),
        ("slack=hooks.slack.com/x", "must be http"),
    ],
)
def test_bad_webhook_flags(flag: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_webhook_flag(flag)


def test_flag_errors_name_the_command_line() -> None:
    with pytest.raises(ConfigError, match="command line: ingest_port -1"):
        with_overrides(ServeConfig(), ingest_port=-1)


def test_min_stall_from_the_file_and_the_flag(tmp_path: Path) -> None:
    from rankwatch.aggregator.health import DEFAULT_MIN_STALL_S

    assert ServeConfig().min_stall_s == DEFAULT_MIN_STALL_S
    cfg = load_config(write(tmp_path, "[serve]\nmin_stall_s = 4\n"))
    assert cfg.min_stall_s == 4
    assert with_overrides(cfg, min_stall_s=1.5).min_stall_s == 1.5
    assert with_overrides(cfg).min_stall_s == 4
    with pytest.raises(ConfigError, match="command line: min_stall_s must be > 0"):
        with_overrides(cfg, min_stall_s=0.0)


def test_token_file_and_allow_hosts(tmp_path: Path) -> None:
    import re

    from rankwatch.aggregator.config import ConfigError, parse_config

    token = tmp_path / "token"
    token.write_text("  s3cret \nignored\n")
    raw = {"serve": {"token_file": str(token), "allow_hosts": ["head.example.org"]}}
    config = parse_config(raw, "f.toml", ServeConfig())
    assert config.token == "s3cret" and config.allow_hosts == ("head.example.org",)
    with pytest.raises(
        ConfigError, match=re.escape("f.toml: 'serve.token_file': cannot read the token")
    ):
        parse_config({"serve": {"token_file": str(tmp_path / "no")}}, "f.toml", ServeConfig())
    with pytest.raises(
        ConfigError, match=re.escape("'serve.allow_hosts' must be a list of host names")
    ):
        parse_config({"serve": {"allow_hosts": ["", 3]}}, "f.toml", ServeConfig())
    with pytest.raises(ConfigError, match=re.escape("'serve.allow_hosts' must be a list")):
        parse_config({"serve": {"allow_hosts": "head"}}, "f.toml", ServeConfig())


def test_public_url_and_incident_knobs_reach_the_aggregator(tmp_path: Path) -> None:
    from rankwatch.aggregator.service import Aggregator

    path = write(tmp_path, f"""
[serve]
data = "{tmp_path / 'data'}"
public_url = "https://rw.example.org/watch/"
[incidents]
window_s = 30
spread_steps = 2
announce_quiet_s = 0.4
announce_hold_s = 0
""")  # fmt: skip
    cfg = load_config(path)
    assert cfg.public_url == "https://rw.example.org/watch/"
    assert (cfg.incidents.window_s, cfg.incidents.spread_steps) == (30, 2)
    assert with_overrides(cfg, public_url="http://head:8670").public_url == "http://head:8670"
    agg = Aggregator(cfg)
    try:
        assert agg.incidents.config == cfg.incidents
        assert (agg.outlet.hold.quiet_s, agg.outlet.hold.max_s) == (0.4, 0)
    finally:
        agg.stop()
