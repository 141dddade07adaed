"""A private PostgreSQL server for the tests and bench/store.py: initdb + pg_ctl into a
temporary directory, listening on a unix socket there and on a free loopback port,
trust authentication for the superuser ``postgres``, stopped by stop().

PostgreSQL refuses to run as root, so under root the server runs as the ``postgres``
user (runuser) and the directory is made theirs. The binaries come from PATH or from
Debian's /usr/lib/postgresql/VERSION/bin (package postgresql); ``missing()`` says why
a server can not be had here, for a skip message.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PROGRAMS = ("initdb", "pg_ctl", "postgres")


def bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, newest version first."""
    found = shutil.which("pg_ctl")
    if found:
        d = Path(os.path.realpath(found)).parent
        if all((d / p).exists() for p in PROGRAMS):
            return d
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                    key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
                    reverse=True):
        if all((Path(d) / p).exists() for p in PROGRAMS):
            return Path(d)
    return None


def missing() -> str | None:
    """Why no server can be started here (None: one can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    if bindir() is None:
        return "PostgreSQL's initdb/pg_ctl/postgres not found (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One running server; ``url(db)`` is a postgresql:// URL for database ``db``."""

    def __init__(self) -> None:
        self.bin = bindir()
        assert self.bin is not None, missing()
        self.dir = Path(tempfile.mkdtemp(prefix="ff-pg-"))
        self.data, self.log = self.dir / "data", self.dir / "server.log"
        self.port = _free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        self.start()
        self.databases = 0

    def _run(self, program: str, *args: str) -> None:
        proc = subprocess.run([*self._as, str(self.bin / program), *args], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{program} {' '.join(args)} failed ({proc.returncode}):\n"
                               f"{proc.stdout}{proc.stderr}{log}")

    def start(self) -> None:
        opts = (f"-k {self.dir} -h 127.0.0.1 -p {self.port} -c max_connections=200 "
                "-c shared_buffers=128MB -c max_wal_size=2GB")
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l",
                  str(self.log), "-o", opts)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data))

    def version(self) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            return conn.execute("SHOW server_version").fetchone()[0]

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def socket_url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@/{db}?host={self.dir}&port={self.port}"

    def create_database(self, prefix: str = "ff") -> str:
        """A new, empty database; its URL."""
        import psycopg

        self.databases += 1
        name = f"{prefix}_{self.databases}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
