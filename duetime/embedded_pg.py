"""A private PostgreSQL for ``duetime run`` when no database is configured.

Layout under ``<data_dir>/pg``: ``data/`` (the cluster), ``socket/`` (its unix socket),
``port`` (the TCP port last used, reused on restart while it is free) and ``postgres.log``.
The server listens on 127.0.0.1 only, with trust authentication: it is a development database
that any local user can reach, never a production one (set ``DUETIME_DATABASE_URL`` for that).

PostgreSQL refuses to run as root, and many machines (containers, CI) run everything as root. Then
the server programs run as an unprivileged system user through ``runuser``: the existing
``postgres`` user when the machine has one, otherwise a ``duetime`` system user created with
``useradd --system``; ``<data_dir>/pg`` is chowned to it. When that user cannot even reach the
data dir (a checkout under ``/root``, mode 700), the cluster lives in
``/var/lib/duetime/pg-<hash of the data dir>`` and ``<data_dir>/pg`` is a symlink to it, so nothing
outside Duetime's own directories changes permission.

Only one ``duetime run`` may use a data dir at a time: an exclusive ``flock`` on
``<data_dir>/embedded-pg.lock`` held for the server's life says so at once. A server left running
by a process that was killed (its ``postmaster.pid`` is live but nobody holds the lock) is stopped
and started again with the current settings.

The server is started with ``pg_ctl``, which puts it in its own session: a Ctrl-C in the terminal
reaches Duetime, not PostgreSQL, so the CLI can stop the API, engine and workers first and the
database last.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import pwd
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from duetime.core.errors import DuetimeError

log = logging.getLogger(__name__)

DATABASE = "duetime"
SUPERUSER = "duetime"
SEARCH_ROOTS = (Path("/usr/lib/postgresql"),)
RELOCATION_ROOT = Path("/var/lib/duetime")
INSTALL_HINT = (
    "install the PostgreSQL server (Debian/Ubuntu: apt-get install postgresql), "
    "or set DUETIME_DATABASE_URL to a database you already run"
)
# Unix socket paths are limited to 107 bytes; longer data dirs listen on TCP only.
_MAX_SOCKET_PATH = 100


class EmbeddedPostgresError(DuetimeError):
    """The embedded database could not be found, started or stopped; the message says what to do."""

    code = "embedded_postgres"


@dataclass(frozen=True, slots=True)
class PgBinaries:
    """One PostgreSQL installation's server programs, all from the same directory and version."""

    bindir: Path
    version: int

    def tool(self, name: str) -> str:
        return str(self.bindir / name)


_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)")


def _has_server_programs(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def _version_key(path: Path) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in path.parent.name.split("."))
    except ValueError:
        return (-1,)


def candidate_bindirs(path_env: str | None = None, search_roots: Sequence[Path] = SEARCH_ROOTS) -> list[Path]:
    """Where server programs are, best first: the one on PATH, then the newest Debian install.

    A program found on PATH is often a symlink (``/usr/local/bin/initdb``); its real directory is
    used so that ``pg_ctl``, ``postgres`` and ``psql`` come from the same version.
    """
    out: list[Path] = []
    found = shutil.which("initdb", path=path_env)
    if found is not None:
        bindir = Path(found).resolve().parent
        if _has_server_programs(bindir):
            out.append(bindir)
    installed: list[Path] = []
    for root in search_roots:
        installed.extend(d for d in root.glob("*/bin") if _has_server_programs(d))
    for bindir in sorted(installed, key=_version_key, reverse=True):
        if bindir.resolve() not in out:
            out.append(bindir.resolve())
    return out


async def find_pg_binaries(
    *,
    prefer_version: int | None = None,
    path_env: str | None = None,
    search_roots: Sequence[Path] = SEARCH_ROOTS,
) -> PgBinaries:
    """The server programs to use; with ``prefer_version``, that major version when installed."""
    found: list[PgBinaries] = []
    for bindir in candidate_bindirs(path_env, search_roots):
        code, out = await _run([str(bindir / "postgres"), "--version"], limit_s=30)
        match = _VERSION.search(out)
        if code == 0 and match is not None:
            found.append(PgBinaries(bindir, int(match.group(1))))
    if not found:
        raise EmbeddedPostgresError(
            "no database is configured and the PostgreSQL server programs (initdb, pg_ctl, "
            "postgres) were found neither on PATH nor under /usr/lib/postgresql/*/bin: " + INSTALL_HINT
        )
    if prefer_version is not None:
        for binaries in found:
            if binaries.version == prefer_version:
                return binaries
    return found[0]


async def _run(argv: Sequence[str], *, limit_s: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a program to completion; (exit code, stdout and stderr together).

    The program runs from a thread with the standard library's ``subprocess`` rather than the event
    loop's subprocess support: uvloop lets children inherit some of its descriptors, and a
    postmaster that inherits the write end of our output pipe keeps ``pg_ctl start`` from ever
    reaching end-of-file (and keeps the loop's sockets alive in a long-lived server).

    A cancelled caller still waits for the program (each is bounded by ``limit_s``): an
    abandoned ``pg_ctl start`` or ``initdb`` would leave a server nobody stops or a half-made
    cluster. A second cancellation stops the waiting.
    """
    done = asyncio.ensure_future(asyncio.to_thread(_run_blocking, list(argv), limit_s, env))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.shield(done)
        raise


def _run_blocking(argv: list[str], limit_s: float, env: dict[str, str] | None) -> tuple[int, str]:
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
    except OSError as exc:
        return 127, f"{argv[0]}: {exc}"
    with proc:
        try:
            out, _ = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return 124, f"{argv[0]} did not finish within {limit_s:.0f} s"
    return proc.returncode, out.decode(errors="replace")


# --- who runs the server ------------------------------------------------------------------------


async def ensure_service_user(candidates: Sequence[str] = ("postgres", "duetime")) -> pwd.struct_passwd:
    """The unprivileged account the server runs as when we are root; creates ``duetime`` if needed."""
    for name in candidates:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    name = candidates[-1]
    code, out = await _run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "Duetime embedded PostgreSQL",
            name,
        ],
        limit_s=60,
    )
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedPostgresError(
            f"PostgreSQL refuses to run as root, and creating the system user {name!r} failed "
            f"({out.strip() or f'useradd exit {code}'}); create an unprivileged user, run "
            "duetime as that user, or set DUETIME_DATABASE_URL"
        ) from None


def as_user_prefix(user: pwd.struct_passwd | None) -> list[str]:
    """The command prefix that drops root for one program, or nothing when we are not root."""
    if user is None:
        return []
    if shutil.which("runuser"):
        return ["runuser", "-u", user.pw_name, "--"]
    if shutil.which("setpriv"):
        return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--"]
    raise EmbeddedPostgresError(
        "PostgreSQL refuses to run as root, and neither runuser nor setpriv (package util-linux) "
        "is installed to start it as another user; install util-linux or set DUETIME_DATABASE_URL"
    )


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


# --- ports ----------------------------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    """Whether 127.0.0.1:port can be bound the way the server binds it (with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _conf_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# Settings for a scheduler's write load: many small fenced updates and batched inserts. Durability
# stays on (fsync, synchronous_commit, full_page_writes): an acknowledged job must survive a crash.
TUNING: dict[str, str] = {
    "max_connections": "200",
    "shared_buffers": "'256MB'",
    "effective_cache_size": "'1GB'",
    "work_mem": "'8MB'",
    "maintenance_work_mem": "'128MB'",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "wal_level": "replica",
    "wal_buffers": "'16MB'",
    "wal_compression": "on",
    "min_wal_size": "'256MB'",
    "max_wal_size": "'2GB'",
    "checkpoint_timeout": "'15min'",
    "checkpoint_completion_target": "0.9",
    "random_page_cost": "1.1",
    "autovacuum_naptime": "'10s'",
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_limit": "2000",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}


class EmbeddedPostgres:
    """``async with EmbeddedPostgres(data_dir) as pg: ... pg.dsn ...``: a server for the block's life."""

    def __init__(
        self,
        data_dir: Path,
        *,
        tuning: dict[str, str] | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.data_dir = data_dir.absolute()
        self.root = self.data_dir / "pg"
        self._tuning = dict(TUNING if tuning is None else tuning)
        self._startup_timeout_s = startup_timeout_s
        self._lock_fd: int | None = None
        self._user: pwd.struct_passwd | None = None
        self._prefix: list[str] = []
        self._binaries: PgBinaries | None = None
        self._port: int | None = None
        self._home: Path | None = None
        self._launched = False

    # Paths inside the cluster home (``<data_dir>/pg`` or where it was relocated).
    @property
    def pgdata(self) -> Path:
        return self._cluster_home / "data"

    @property
    def socket_dir(self) -> Path:
        return self._cluster_home / "socket"

    @property
    def log_file(self) -> Path:
        return self._cluster_home / "postgres.log"

    @property
    def _port_file(self) -> Path:
        return self._cluster_home / "port"

    @property
    def _cluster_home(self) -> Path:
        return self._home if self._home is not None else self.root

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL is not running")
        return self._port

    @property
    def dsn(self) -> str:
        """Where the ``duetime`` database answers, for asyncpg and every other client."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    async def __aenter__(self) -> EmbeddedPostgres:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Shielded: a second Ctrl-C must not leave the server running without anyone to stop it.
        await asyncio.shield(self.stop())

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            await self._start_locked()
        except BaseException:
            await asyncio.shield(self.stop())
            raise

    async def stop(self) -> None:
        """Fast shutdown (open sessions are ended, the WAL is flushed), then release the data dir."""
        try:
            if self._launched and await self._server_running():
                code, out = await self._pg_ctl("stop", "-m", "fast", "-t", "60")
                if code != 0 and await self._server_running():
                    log.warning("fast stop failed (%s); stopping PostgreSQL immediately", out.strip())
                    await self._pg_ctl("stop", "-m", "immediate", "-t", "60")
            self._launched = False
            self._port = None
        finally:
            self._release_lock()

    # --- the steps ------------------------------------------------------------------------------

    def _acquire_lock(self) -> None:
        path = self.data_dir / "embedded-pg.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EmbeddedPostgresError(
                f"another Duetime (pid {holder}) is already running the embedded PostgreSQL in "
                f"{self.data_dir}; stop it first, or give this one its own DUETIME_DATA_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)

    async def _start_locked(self) -> None:
        if os.geteuid() == 0:
            self._user = await ensure_service_user()
            self._prefix = as_user_prefix(self._user)
            await self._place_cluster_home()
        else:
            self.root.mkdir(mode=0o700, exist_ok=True)
        version_file = self.pgdata / "PG_VERSION"
        existing = int(version_file.read_text().strip()) if version_file.exists() else None
        self._binaries = await find_pg_binaries(prefer_version=existing)
        if existing is not None and existing != self._binaries.version:
            raise EmbeddedPostgresError(
                f"the embedded cluster in {self.pgdata} was made by PostgreSQL {existing}, but the "
                f"installed server is version {self._binaries.version}; install PostgreSQL {existing} "
                f"or move {self.pgdata} away to start with an empty database"
            )
        if existing is None:
            await self._initdb()
        self._make_owned_dir(self.socket_dir)
        if await self._server_running():
            log.warning(
                "an embedded PostgreSQL left running by a Duetime that did not stop cleanly is "
                "using %s; restarting it",
                self.pgdata,
            )
            await self._pg_ctl("stop", "-m", "fast", "-t", "60")
        await self._start_server()
        await self._ensure_database()

    async def _place_cluster_home(self) -> None:
        """As root: give the server user a home it can reach, relocating it when it cannot."""
        assert self._user is not None
        uid, gid = self._user.pw_uid, self._user.pw_gid
        if self.root.is_symlink():
            # Placed by an earlier start (below): keep using it, wherever the data dir moved since.
            self._home = self.root.resolve()
            self._home.mkdir(mode=0o700, parents=True, exist_ok=True)
        else:
            reachable, _ = await _run([*self._prefix, "test", "-x", str(self.data_dir)], limit_s=30)
            if reachable == 0:
                self.root.mkdir(mode=0o700, exist_ok=True)
            else:
                digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
                home = RELOCATION_ROOT / f"pg-{digest}"
                if self.root.exists():
                    raise EmbeddedPostgresError(
                        f"PostgreSQL runs as user {self._user.pw_name!r}, which cannot reach "
                        f"{self.data_dir} (a parent directory is not searchable by it); move "
                        f"{self.root} to {home} and link it back, or set DUETIME_DATA_DIR to a "
                        "directory it can reach"
                    )
                _make_relocated_home(home, self.root)
                log.info(
                    "user %s cannot reach %s; the embedded cluster lives in %s",
                    self._user.pw_name,
                    self.data_dir,
                    home,
                )
                self._home = home
        home = self._cluster_home
        if home.stat().st_uid != uid:
            _chown_tree(home, uid, gid)

    def _make_owned_dir(self, path: Path) -> None:
        path.mkdir(mode=0o700, exist_ok=True)
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _write_owned(self, path: Path, text: str) -> None:
        path.write_text(text, encoding="utf-8")
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    async def _as_server_user(self, argv: Sequence[str], limit_s: float) -> tuple[int, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        return await _run([*self._prefix, *argv], limit_s=limit_s, env=env)

    async def _initdb(self) -> None:
        assert self._binaries is not None
        log.info("creating the embedded PostgreSQL cluster in %s", self.pgdata)
        code, out = await self._as_server_user(
            [
                self._binaries.tool("initdb"),
                "--pgdata",
                str(self.pgdata),
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                f"--username={SUPERUSER}",
            ],
            limit_s=300,
        )
        if code != 0:
            raise EmbeddedPostgresError(f"initdb failed in {self.pgdata}: {_last_lines(out)}")
        conf = self.pgdata / "postgresql.conf"
        with conf.open("a", encoding="utf-8") as f:
            f.write("\n# Duetime's settings, rewritten at each start (ALTER SYSTEM overrides them).\n")
            f.write("include_if_exists = 'duetime.conf'\n")

    def _write_config(self, port: int) -> None:
        lines = [
            "# Written by Duetime at every start of the embedded server; edits here are lost.",
            "listen_addresses = '127.0.0.1'",
            f"port = {port}",
        ]
        socket_path = self.socket_dir / f".s.PGSQL.{port}"
        if len(str(socket_path)) <= _MAX_SOCKET_PATH:
            lines.append(f"unix_socket_directories = {_conf_quote(str(self.socket_dir))}")
        else:
            lines.append("unix_socket_directories = ''")
        lines.extend(f"{key} = {value}" for key, value in self._tuning.items())
        self._write_owned(self.pgdata / "duetime.conf", "\n".join(lines) + "\n")

    def _choose_port(self, avoid: set[int]) -> int:
        with contextlib.suppress(OSError, ValueError):
            remembered = int(self._port_file.read_text().strip())
            if remembered not in avoid and port_is_free(remembered):
                return remembered
        while True:
            port = free_port()
            if port not in avoid:
                return port

    async def _start_server(self) -> None:
        tried: set[int] = set()
        for _ in range(3):
            port = self._choose_port(tried)
            tried.add(port)
            self._write_config(port)
            log_size = self.log_file.stat().st_size if self.log_file.exists() else 0
            self._launched = True
            code, out = await self._pg_ctl(
                "start", "-l", str(self.log_file), "-t", str(int(self._startup_timeout_s))
            )
            if code == 0:
                self._port = port
                self._write_owned(self._port_file, f"{port}\n")
                log.info("embedded PostgreSQL is listening on 127.0.0.1:%d (%s)", port, self.pgdata)
                return
            new_log = self._read_log_from(log_size)
            if "could not bind" in new_log or "already in use" in new_log:
                continue  # someone took the port between our check and the server's bind
            if "lock file" in new_log and "already exists" in new_log:
                raise EmbeddedPostgresError(
                    f"another PostgreSQL is already running on {self.pgdata} (see its "
                    f"postmaster.pid); stop it first: {_last_lines(new_log)}"
                )
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL did not start ({_last_lines(out)}); its log "
                f"{self.log_file} says: {_last_lines(new_log)}"
            )
        raise EmbeddedPostgresError(f"the embedded PostgreSQL found no free port (tried {sorted(tried)})")

    def _read_log_from(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    async def _pg_ctl(self, action: str, *args: str) -> tuple[int, str]:
        assert self._binaries is not None
        argv = [self._binaries.tool("pg_ctl"), action, "-D", str(self.pgdata), "-s"]
        if action in ("start", "stop"):
            argv.append("-w")
        return await self._as_server_user([*argv, *args], limit_s=self._startup_timeout_s + 30)

    async def _server_running(self) -> bool:
        if self._binaries is None or not (self.pgdata / "postmaster.pid").exists():
            return False
        code, _ = await self._pg_ctl("status")
        return code == 0

    async def _psql(self, sql: str) -> str:
        assert self._binaries is not None
        psql = self._binaries.tool("psql")
        if not os.access(psql, os.X_OK):
            psql = shutil.which("psql") or psql
        code, out = await _run(
            [
                psql,
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-t",
                "-A",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                "postgres",
                "-c",
                sql,
            ],
            limit_s=60,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "PGCONNECT_TIMEOUT": "10"},
        )
        if code != 0:
            raise EmbeddedPostgresError(f"the embedded PostgreSQL refused {sql!r}: {_last_lines(out)}")
        return out.strip()

    async def _ensure_database(self) -> None:
        exists = await self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'")
        if exists != "1":
            await self._psql(f'CREATE DATABASE "{DATABASE}"')


def _make_relocated_home(home: Path, link: Path) -> None:
    RELOCATION_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    home.mkdir(mode=0o700, exist_ok=True)
    link.symlink_to(home, target_is_directory=True)


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:]) if lines else "no output"


def running_dsn(data_dir: Path) -> str | None:
    """The DSN of the embedded server a ``duetime run`` holds in ``data_dir``, if one does.

    Lets ``duetime keys`` and ``duetime migrate`` work against the database of a running
    ``duetime run`` without the user copying its port around.
    """
    root = data_dir.absolute() / "pg"
    lock = data_dir.absolute() / "embedded-pg.lock"
    try:
        port = int((root / "port").read_text().strip())
        fd = os.open(lock, os.O_RDONLY)
    except (OSError, ValueError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{DATABASE}"
    finally:
        os.close(fd)
    return None
