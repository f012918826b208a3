"""Run a command with a PostgreSQL for the tests: the one at $FLEETGATE_TEST_PG_DSN when it
answers, else a throwaway server of its own, stopped and deleted when the command ends.

    python tests/pg/with_postgres.py -- pytest -q tests/store
    python tests/pg/with_postgres.py --answers     # exit 0 if the DSN's server answers

The throwaway server is Debian's (`/usr/lib/postgresql/N/bin`, the newest N; `make test`
installs the `postgresql` package when it is missing): `initdb` in a temporary directory with
trust authentication for loopback only, a free port on 127.0.0.1, a database `test`. The
command then runs with FLEETGATE_TEST_PG_DSN pointing at it. initdb and the server refuse to
run as root: as root they run as `nobody` (through runuser), the directory handed to it.
The command's exit status is this script's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ENV = "FLEETGATE_TEST_PG_DSN"
DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres"  # tests/support.py's
SERVER_USER = "nobody"  # who runs the server when this script runs as root


class NoServer(Exception):
    """No PostgreSQL server binaries, or the throwaway server did not start."""


def answers(dsn: str, timeout_s: int = 3) -> bool:
    """Does a server accept a connection at `dsn`?"""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=timeout_s, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def server_bin() -> Path:
    """The newest Debian PostgreSQL server's bin directory."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)  # fmt: skip
    if not found:
        raise NoServer("no PostgreSQL server under /usr/lib/postgresql/*/bin: "
                       "apt-get install postgresql (make test does, as root)")  # fmt: skip
    return found[-1].parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def throwaway() -> Iterator[str]:
    """A fresh server on a free loopback port; yields its DSN; stopped and deleted after."""
    bin_dir = server_bin()
    root = Path(tempfile.mkdtemp(prefix="fleetgate-pg-"))
    data, sockets, log = root / "data", root / "sock", root / "server.log"
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", SERVER_USER, "--"]
        shutil.chown(root, SERVER_USER)
    run = _runner(as_user)
    started = False
    try:
        run(["mkdir", str(sockets)])
        run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "--no-sync", "-E", "UTF8", "--locale=C"])  # fmt: skip
        port = free_port()
        options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets} -c fsync=off "
                   "-c full_page_writes=off -c synchronous_commit=off")  # fmt: skip
        run([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w",
             "-t", "60", "start"])  # fmt: skip
        started = True
        dsn = f"host=127.0.0.1 port={port} dbname=test user=postgres"
        _create_database(f"host=127.0.0.1 port={port} dbname=postgres user=postgres", "test")
        print(f"with_postgres: a throwaway PostgreSQL ({bin_dir.parent.name}) on 127.0.0.1:{port}",
              file=sys.stderr)  # fmt: skip
        yield dsn
    finally:
        if started:
            run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                check=False)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def _runner(prefix: list[str]) -> Callable[..., None]:
    def run(command: list[str], check: bool = True) -> None:
        out = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
        if check and out.returncode != 0:
            raise NoServer(f"{' '.join(command)}: exit {out.returncode}: "
                           f"{(out.stderr or out.stdout)[-1500:]}")  # fmt: skip

    return run


def _create_database(dsn: str, name: str) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=3, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_command(command: list[str], env: dict[str, str]) -> int:
    """Run `command`, passing SIGINT and SIGTERM on to it; its exit status."""
    proc = subprocess.Popen(command, env=env)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--answers", action="store_true", help="exit 0 if the DSN's server answers")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = p.parse_args(argv)
    dsn = os.environ.get(ENV) or DEFAULT_DSN
    if args.answers:
        return 0 if answers(dsn) else 1
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given")
    if answers(dsn):
        return run_command(command, {**os.environ, ENV: dsn})
    print(f"with_postgres: no PostgreSQL answers at {dsn!r}; starting one", file=sys.stderr)
    try:
        with throwaway() as own:
            return run_command(command, {**os.environ, ENV: own})
    except NoServer as exc:
        print(f"with_postgres: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
