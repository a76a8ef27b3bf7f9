"""`rankwatch keys`: make the CurveZMQ key files for encrypted, authenticated ingest.

Writes ``server.key``/``server.key_secret`` and ``client.key``/``client.key_secret`` (or
``client-NAME.*`` with ``--client NAME``) in the ZeroMQ certificate format; secret files are
created with mode 0600 (never readable by others, not even for an instant) and existing files
are never overwritten. See ``rankwatch.agent.wire.curve`` for which file goes where.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

NAME = "keys"
HELP = "make CurveZMQ key files (encrypted ingest: serve --curve DIR, agents RANKWATCH_CURVE_DIR)"
DEFAULT_DIR = "rankwatch_keys"
SECRET_MODE = 0o600
PUBLIC_MODE = 0o644
DIR_MODE = 0o700
_CLIENT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_BANNER = (
    "#   ****  Generated on {when} by rankwatch keys  ****\n"
    "#   ZeroMQ CURVE {kind} Certificate\n"
    "{warning}\n"
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help=HELP, description=__doc__.split("\n\n")[1])
    parser.add_argument(
        "--dir", default=DEFAULT_DIR, metavar="DIR", help=f"where to write (./{DEFAULT_DIR})"
    )
    parser.add_argument(
        "--client",
        metavar="NAME",
        help="make only another client key pair, client-NAME.key(_secret), in an existing DIR",
    )
    parser.set_defaults(func=run)
    return parser


def _fail(message: str) -> int:
    print(f"rankwatch keys: {message}", file=sys.stderr)
    return 2


def write_key_file(path: Path, public: bytes, secret: bytes | None) -> None:
    """One certificate file, created exclusively (never overwrites), 0600 when secret."""
    kind, warning = ("Public", "")
    if secret is not None:
        kind = "**Secret**"
        warning = "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = _BANNER.format(when=when, kind=kind, warning=warning)
    text += f'metadata\ncurve\n    public-key = "{public.decode("ascii")}"\n'
    if secret is not None:
        text += f'    secret-key = "{secret.decode("ascii")}"\n'
    mode = SECRET_MODE if secret is not None else PUBLIC_MODE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away from a public file
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def make_pair(directory: Path, name: str) -> tuple[Path, Path]:
    """``name.key`` (public) and ``name.key_secret`` (0600) in ``directory``."""
    import zmq

    public, secret = zmq.curve_keypair()
    pub_path, sec_path = directory / f"{name}.key", directory / f"{name}.key_secret"
    for path in (pub_path, sec_path):
        if path.exists():
            raise FileExistsError(f"{path} already exists (remove it to make new keys)")
    write_key_file(sec_path, public, secret)
    write_key_file(pub_path, public, None)
    return pub_path, sec_path


def run(args: argparse.Namespace) -> int:
    import zmq

    if not zmq.has("curve"):
        return _fail("this pyzmq/libzmq has no CURVE support")
    directory = Path(args.dir).expanduser()
    made: tuple[Path, ...]
    try:
        if args.client is not None:
            if not _CLIENT_NAME.match(args.client):
                return _fail(f"--client {args.client!r}: use letters, digits, '.', '_', '-'")
            if not (directory / "server.key").is_file():
                hint = f"run `rankwatch keys --dir {directory}` first"
                return _fail(f"no server.key in {directory}: {hint}")
            made = make_pair(directory, f"client-{args.client}")
        else:
            for name in ("server.key", "server.key_secret", "client.key", "client.key_secret"):
                if (directory / name).exists():  # all four or none: never a mixed set
                    return _fail(f"{directory / name} already exists (remove it to make new keys)")
            directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            made = (*make_pair(directory, "server"), *make_pair(directory, "client"))
    except OSError as exc:  # FileExistsError, permissions, a file where DIR should be
        return _fail(str(exc))
    for path in made:
        print(f"wrote {path}")
    secret_name = made[-1].name
    print(
        f"head node:       rankwatch serve --curve {directory}\n"
        f"training nodes:  copy server.key and {secret_name} (only that client secret) to one "
        "directory and set RANKWATCH_CURVE_DIR to it\n"
        "keep server.key_secret on the head node only"
    )
    return 0
