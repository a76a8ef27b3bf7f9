"""`rankwatch serve`: the aggregator plus the dashboard, in one process."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rankwatch.aggregator.service import Aggregator, ServeConfig
    from rankwatch.dashboard.access import Access
    from rankwatch.dashboard.remote_write import RemoteWriter

NAME = "serve"
HELP = "run the aggregator and the dashboard (agents connect to it)"
TOKEN_ENV = "RANKWATCH_TOKEN"  # read when --token is not given, so it stays out of `ps`
CURVE_ENV = "RANKWATCH_CURVE_DIR"  # what the agents read (see rankwatch.agent.sender)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help=HELP,
        description=(
            "Receive every rank's records over ZeroMQ, store them, watch health and cross-rank "
            "divergence, raise alerts, and serve the dashboard. Flags override the config file."
        ),
    )
    parser.add_argument("--data", metavar="DIR", help="data directory (default ./rankwatch_data)")
    parser.add_argument("--host", help="dashboard address (default 127.0.0.1; 0.0.0.0: all)")
    parser.add_argument("--port", type=int, help="dashboard HTTP port (default 8670; 0: any)")
    parser.add_argument("--ingest-host", help="address agents connect to (default *: all)")
    parser.add_argument("--ingest-port", type=int, help="ZeroMQ ingest port (default 8671)")
    parser.add_argument("--config", metavar="FILE", help="TOML config (see docs/alerts.md)")
    parser.add_argument(
        "--token",
        help="require this token for the dashboard and API (it shows in `ps`: prefer "
        f"--token-file or {TOKEN_ENV}); the ZeroMQ ingest port does not check it (--curve does)",
    )
    parser.add_argument(
        "--token-file", metavar="FILE", help="read the token from the first line of FILE"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the dashboard answers to, besides IP addresses, localhost and this "
        "machine's name (repeatable; '*': any, behind a proxy that checks names itself)",
    )
    parser.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="KIND=URL",
        help="send alerts to a webhook of KIND (json, slack, dingtalk, ...: an unknown KIND "
        "lists them all; repeatable; secrets go in the config file)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="RULE",
        help="act on incidents: a preset (stop-on-nan, checkpoint-on-nan, stop-on-crash) or "
        "CAUSE[@STEPS]:ACTION[+ACTION], like nonfinite:checkpoint+stop (repeatable; ranks act "
        "only on what they accept: RANKWATCH_ACCEPT; default: notify only)",
    )
    parser.add_argument(
        "--min-stall-s",
        type=float,
        metavar="SECONDS",
        help="a rank whose step has not advanced for this long (or for 10 of its step times, "
        "if longer) is stalled (default 30)",
    )
    parser.add_argument(
        "--remote-write",
        metavar="URL",
        help="push /metrics to a time-series store every 10 s (remote_write_interval_s), e.g. "
        "VictoriaMetrics' http://HOST:8428/api/v1/import/prometheus (docs/cluster.md)",
    )
    parser.add_argument(
        "--public-url",
        metavar="URL",
        help="the dashboard's address as people reach it (a proxy, a DNS name); incident "
        "messages then link to the run at the fault step, e.g. https://rankwatch.example.org/",
    )
    parser.add_argument(
        "--curve",
        metavar="DIR",
        help="encrypt and authenticate ingest with CurveZMQ, keys from `rankwatch keys --dir "
        f"DIR`; agents then need {CURVE_ENV}. HTTP ingest (POST /api/ingest) is then off "
        "unless a token is set",
    )
    parser.set_defaults(func=run)
    return parser


def _fail(message: str) -> int:
    print(f"rankwatch serve: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from rankwatch.agent.wire.curve import CurveError, client_keys, server_keys
    from rankwatch.aggregator.config import (
        ConfigError,
        load_config,
        read_token_file,
        with_overrides,
    )
    from rankwatch.aggregator.store.db import StoreError

    try:
        if args.token and args.token_file:
            raise ConfigError("give --token or --token-file, not both")
        config = load_config(args.config)
        token = args.token
        if args.token_file:
            token = read_token_file(args.token_file, "--token-file")
        config = with_overrides(
            config,
            data=args.data,
            host=args.host,
            port=args.port,
            ingest_host=args.ingest_host,
            ingest_port=args.ingest_port,
            token=token or (os.environ.get(TOKEN_ENV) if config.token is None else None),
            allow_hosts=args.allow_host,
            webhooks=args.webhook,
            min_stall_s=args.min_stall_s,
            remote_write=args.remote_write,
            public_url=args.public_url,
            policies=args.policy,
        )
        if args.curve:
            curve = Path(args.curve).expanduser()
            server_keys(curve)  # fail now, with the file named, not when agents connect
            if not client_keys(curve):
                raise CurveError(f"no client*.key in {curve}: run `rankwatch keys --dir {curve}`")
            config = dataclasses.replace(config, curve_dir=curve)
    except (ConfigError, CurveError) as exc:
        return _fail(str(exc))
    if busy := _busy_ports(config):  # before the store exists, and before uvicorn's own error
        return _fail("; ".join(busy))

    import uvicorn
    from rankwatch.aggregator.provider import AggregatorProvider
    from rankwatch.aggregator.service import Aggregator, tune_gc
    from rankwatch.dashboard.app import create_app

    signal.signal(signal.SIGTERM, _sigterm)
    try:
        aggregator = Aggregator(config)
    except StoreError as exc:
        return _fail(f"{exc}\n({exc.hint})" if exc.hint else str(exc))
    try:
        try:
            aggregator.start()
        except CurveError as exc:
            return _fail(str(exc))
        from rankwatch.dashboard.live import SHUTDOWN_GRACE_S
        from rankwatch.dashboard.protocol import server_options

        tune_gc()

        app = create_app(AggregatorProvider(aggregator), config.token, _access(config))
        uv_config = uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            lifespan="on",
            # Live streams never end by themselves: without a grace limit uvicorn waits for
            # them forever on SIGTERM / Ctrl-C.
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
            **server_options(),  # 414/431 for an oversized request head, not a reset
        )
        try:
            sock = listen_socket(config.host, config.port)
        except OSError as exc:
            where = f"{config.host}:{config.port}"
            return _fail(f"cannot listen on {where}: {exc}; pick another --port")
        _banner(config, aggregator.ingest_port, sock.getsockname()[1])
        writer = _remote_writer(config, aggregator)
        try:
            uvicorn.Server(uv_config).run(sockets=[sock])
        finally:
            if writer is not None:
                writer.stop()  # one last push: the store gets each run's final state
    except OSError as exc:
        return _fail(str(exc))
    finally:
        aggregator.stop()  # last tick, store flush, webhooks drained (bounded)
    return 0


def _remote_writer(config: ServeConfig, aggregator: Aggregator) -> RemoteWriter | None:
    if config.remote_write is None:
        return None
    from rankwatch.aggregator.provider import AggregatorProvider
    from rankwatch.dashboard import prom
    from rankwatch.dashboard.remote_write import RemoteWriter

    provider = AggregatorProvider(aggregator)

    def render() -> str:
        counts = writer.counts
        counters = {
            **provider.counters(),
            "remote_write_pushes": counts.pushes,
            "remote_write_failures": counts.failures,
        }
        return prom.render(provider.snapshot(), counters, len(provider.alerts_firing()))

    writer = RemoteWriter(config.remote_write, render, config.remote_write_interval_s)
    writer.start()
    interval = f"{config.remote_write_interval_s:g}"
    print(f"  remote write: {config.remote_write} every {interval} s", flush=True)
    return writer


def _access(config: ServeConfig) -> Access:
    from rankwatch.dashboard.access import Access

    # With --curve the ZeroMQ port checks every agent's key; HTTP ingest without a token would
    # be a way around it, so it takes records only when a token guards it.
    ingest_off = None
    if config.curve_dir is not None and not config.token:
        ingest_off = (
            "HTTP ingest is off: this server takes records only over its CurveZMQ port "
            "(serve --curve), where each agent's key is checked; for `rankwatch import --url` "
            f"start it with a token too (--token-file or {TOKEN_ENV})"
        )
    return Access.for_server(
        config.host, (socket.gethostname(),), config.allow_hosts, ingest_off=ingest_off
    )


def listen_socket(host: str, port: int) -> socket.socket:
    """The dashboard's listening socket, bound here so its address is known for the banner.

    Its protocol is IPPROTO_TCP, not the 0 that ``uvicorn.Config.bind_socket`` leaves: asyncio
    sets TCP_NODELAY on each accepted connection only when the socket says it is TCP
    (``asyncio.base_events._set_nodelay``), and without it a small response waits for the
    client's delayed ACK on every request after the first on a keep-alive connection."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _busy_ports(config: ServeConfig) -> list[str]:
    from rankwatch.cli.ports import busy_message, in_use

    busy = []
    if in_use(config.host, config.port):
        busy.append("dashboard " + busy_message("http", config.host, config.port, "--port"))
    if in_use(config.ingest_host, config.ingest_port):
        where = busy_message("tcp", config.ingest_host, config.ingest_port, "--ingest-port")
        busy.append("agents' address " + where)
    return busy


def _sigterm(signum: int, frame: object) -> None:
    # uvicorn re-raises the signal it shut down on once it has stopped; with the default
    # handler SIGTERM would then kill the process before the store's last flush. A stop
    # asked for (systemd, Kubernetes) is a clean exit.
    raise SystemExit(0)


def _banner(config: ServeConfig, ingest_port: int, port: int) -> None:
    host, ingest_host = config.host, config.ingest_host
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = socket.gethostname()
    head = socket.gethostname() if ingest_host in ("*", "0.0.0.0", "::") else ingest_host
    data = Path(config.data_dir).resolve()
    token = "  (token required)" if config.token else ""
    lines = [
        f"rankwatch: dashboard http://{shown}:{port}/{token}",
        f"rankwatch: agents connect to tcp://{head}:{ingest_port}   data in {data}",
        "rankwatch: in the training script (every rank), add:",
        f'    from rankwatch.agent import Monitor; mon = Monitor(addr="{head}:{ingest_port}")',
        "  and call mon.log(step, loss=loss) each step "
        f"(or export RANKWATCH_ADDR={head}:{ingest_port} and use Monitor())",
    ]
    if config.public_url:
        lines.append(f"rankwatch: incident messages link to the dashboard at {config.public_url}")
    if config.curve_dir is not None:
        lines.append(
            f"rankwatch: ingest is encrypted (CurveZMQ): give every node server.key and "
            f"client.key_secret from {config.curve_dir} and set {CURVE_ENV} to their directory"
        )
        if not config.token:
            lines.append("rankwatch: HTTP ingest (POST /api/ingest) is off: no token is set")
    elif config.token:
        lines.append(
            "rankwatch: the token guards the dashboard and HTTP ingest, not the ZeroMQ ingest "
            "port: use --curve for that"
        )
    if host not in ("127.0.0.1", "localhost", "::1") and not config.token:
        lines.append(
            f"rankwatch: warning: the dashboard on {host} has no token: anyone who can reach "
            f"it can read every run (set {TOKEN_ENV} or --token)"
        )
    print("\n".join(lines), flush=True)
