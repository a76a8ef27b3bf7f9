"""rankwatch on the time-series engines people already run: a real Prometheus scrapes a real
`rankwatch serve`, and the same serve pushes to a real VictoriaMetrics (`--remote-write`); both
query APIs return the per-rank series, rank states and the incident with its culprit, and every
query of the shipped Grafana dashboard runs against what Prometheus holds.

Four real agents log over ZeroMQ: rank r logs lr = 0.1 * (r + 1) (a per-rank value the queries
must give back exactly), and rank 2's loss goes NaN one step before the others', so the
incident's culprit is rank 2.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rankwatch.agent import Monitor

from .conftest import Serve, free_port, get_json, stop_process

RUN = "lake"
RANKS = 4
CULPRIT = 2
NAN_STEP = 9
GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "rankwatch.json"


def engine(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package {name}; deploy/dev-setup.sh --tests)")
    return path


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[[list[str]], None]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str]) -> None:
        log = (tmp_path / f"{Path(cmd[0]).name}.log").open("ab")
        procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    yield start
    for proc in procs:
        stop_process(proc)


def query(base: str, promql: str) -> list[dict[str, Any]] | None:
    """An instant query's result vector, or None while the engine does not answer yet."""
    answer = get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if not answer:
        return None
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


@pytest.fixture
def train(tmp_path: Path) -> Iterator[Callable[[Serve], None]]:
    """``train(serve)``: four ranks log ten steps; they stay open (the run live) until the end."""
    monitors: list[Monitor] = []
    yield lambda serve: monitors.extend(_train(serve, tmp_path))
    for mon in monitors:
        mon.close()


def _train(serve: Serve, tmp_path: Path) -> list[Monitor]:
    monitors = [
        Monitor(RUN, rank, RANKS, serve.ingest_addr, tmp_path / "logs", heartbeat_s=0.5)
        for rank in range(RANKS)
    ]
    for step in range(1, NAN_STEP + 2):
        for rank, mon in enumerate(monitors):
            bad = step >= NAN_STEP + (rank != CULPRIT)
            loss = math.nan if bad else 2.0 / step + 0.01 * rank
            mon.log(step, loss=loss, lr=0.1 * (rank + 1), throughput=100.0 + rank)
    serve.wait_for(
        "the incident",
        lambda: any(i.get("culprits") == [CULPRIT] for i in (serve.run_entry(RUN) or {}).get(
            "incidents", []
        )),
    )  # fmt: skip
    return monitors


def per_rank(result: list[dict[str, Any]]) -> dict[int, float]:
    return {int(s["metric"]["rank"]): float(s["value"][1]) for s in result}


def check_engine(base: str, serve: Serve) -> None:
    lr = serve.wait_for(
        f"{base} to hold every rank's lr",
        lambda: (
            (r := query(base, f'rankwatch_metric_last{{run="{RUN}",metric="lr"}}'))
            and len(r) == RANKS
            and r
        ),
        timeout_s=60,
    )
    assert per_rank(lr) == pytest.approx({r: 0.1 * (r + 1) for r in range(RANKS)})
    steps = query(base, f'rankwatch_rank_last_step{{run="{RUN}"}}') or []
    assert per_rank(steps) == {r: NAN_STEP + 1 for r in range(RANKS)}
    incidents = serve.wait_for(
        f"{base} to hold the incident",
        lambda: query(base, f'rankwatch_incident_open{{run="{RUN}"}}'),
        timeout_s=30,
    )
    assert [(s["metric"]["cause"], s["metric"]["culprit"]) for s in incidents] == [
        ("nonfinite", str(CULPRIT))
    ]
    states = query(base, f'sum by (state) (rankwatch_rank_state{{run="{RUN}"}})') or []
    assert sum(float(s["value"][1]) for s in states) == RANKS


@pytest.mark.timeout(240)
def test_prometheus_scrapes_serve_and_runs_the_grafana_queries(
    tmp_path: Path,
    serve_factory: Callable[..., Serve],
    started: Callable[[list[str]], None],
    train: Callable[[Serve], None],
) -> None:
    prometheus = engine("prometheus")
    serve = serve_factory()
    port = free_port()
    target = f"127.0.0.1:{serve.port}"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: rankwatch, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    started([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"])  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    train(serve)
    check_engine(base, serve)

    dashboard = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) == len(dashboard["panels"]) >= 8
    empty = []
    for expr in exprs:
        ready = expr.replace("$run", RUN).replace("$metric", "loss")
        if not query(base, ready):  # status "success" is asserted inside: every query parses
            empty.append(expr)
    assert not empty, empty  # every panel has data for this run
    for variable in dashboard["templating"]["list"][1:]:
        ready = variable["definition"].replace("$run", RUN)
        name = ready.split("(", 1)[1].rsplit(",", 1)[0]
        label = ready.rsplit(",", 1)[1].strip(" )")
        assert {s["metric"][label] for s in query(base, name) or []}, ready


@pytest.mark.timeout(240)
def test_serve_pushes_to_victoria_metrics(
    tmp_path: Path,
    serve_factory: Callable[..., Serve],
    started: Callable[[list[str]], None],
    train: Callable[[Serve], None],
) -> None:
    victoria = engine("victoria-metrics")
    port = free_port()
    started([victoria, f"-httpListenAddr=127.0.0.1:{port}",
             f"-storageDataPath={tmp_path / 'vm'}", "-search.latencyOffset=0s"])  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    config = tmp_path / "serve.toml"
    config.write_text("[serve]\nremote_write_interval_s = 1.0\n")
    serve = serve_factory(
        extra=["--config", str(config), "--remote-write", f"{base}/api/v1/import/prometheus"]
    )
    train(serve)
    check_engine(base, serve)
    pushed = query(base, "rankwatch_aggregator_remote_write_pushes") or []
    assert pushed and float(pushed[0]["value"][1]) >= 1
    assert "remote write: http://127.0.0.1" in serve.tail(60)
