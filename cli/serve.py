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
    from rankwatch.aggregator.service import ServeConfig

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
        "--token", help=f"require this token for the dashboard and API (or set {TOKEN_ENV})"
    )
    parser.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="KIND=URL",
        help="send alerts to a webhook; KIND: json, slack, dingtalk, wecom, feishu "
        "(repeatable; secrets go in the config file)",
    )
    parser.add_argument(
        "--min-stall-s",
        type=float,
        metavar="SECONDS",
        help="a rank whose step has not advanced for this long (or for 10 of its step times, "
        "if longer) is stalled (default 30)",
    )
    parser.add_argument(
        "--curve",
        metavar="DIR",
        help="encrypt and authenticate ingest with CurveZMQ, keys from `rankwatch keys --dir "
        f"DIR`; agents then need {CURVE_ENV}",
    )
    parser.set_defaults(func=run)
    return parser


def _fail(message: str) -> int:
    print(f"rankwatch serve: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from rankwatch.agent.wire.curve import CurveError, client_keys, server_keys
    from rankwatch.aggregator.config import ConfigError, load_config, with_overrides
    from rankwatch.aggregator.store.db import StoreError

    try:
        config = load_config(args.config)
        config = with_overrides(
            config,
            data=args.data,
            host=args.host,
            port=args.port,
            ingest_host=args.ingest_host,
            ingest_port=args.ingest_port,
            token=args.token or (os.environ.get(TOKEN_ENV) if config.token is None else None),
            webhooks=args.webhook,
            min_stall_s=args.min_stall_s,
        )
        if args.curve:
            curve = Path(args.curve).expanduser()
            server_keys(curve)  # fail now, with the file named, not when agents connect
            if not client_keys(curve):
                raise CurveError(f"no client*.key in {curve}: run `rankwatch keys --dir {curve}`")
            config = dataclasses.replace(config, curve_dir=curve)
    except (ConfigError, CurveError) as exc:
        return _fail(str(exc))

    import uvicorn
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

        tune_gc()

        app = create_app(aggregator, config.token)
        uv_config = uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            lifespan="on",
            # Live streams never end by themselves: without a grace limit uvicorn waits for
            # them forever on SIGTERM / Ctrl-C.
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        try:
            sock = uv_config.bind_socket()
        except SystemExit:  # uvicorn exits when it cannot bind; say which address
            return _fail(f"cannot listen on {config.host}:{config.port} (address in use?)")
        _banner(config, aggregator.ingest_port, sock.getsockname()[1])
        uvicorn.Server(uv_config).run(sockets=[sock])
    except OSError as exc:
        return _fail(str(exc))
    finally:
        aggregator.stop()  # last tick, store flush, webhooks drained (bounded)
    return 0


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
    if config.curve_dir is not None:
        lines.append(
            f"rankwatch: ingest is encrypted (CurveZMQ): give every node server.key and "
            f"client.key_secret from {config.curve_dir} and set {CURVE_ENV} to their directory"
        )
    if host not in ("127.0.0.1", "localhost", "::1") and not config.token:
        lines.append(
            f"rankwatch: warning: the dashboard on {host} has no token: anyone who can reach "
            f"it can read every run (set {TOKEN_ENV} or --token)"
        )
    print("\n".join(lines), flush=True)
