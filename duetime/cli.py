"""The ``duetime`` command: the composition root that turns settings into running parts.

``duetime run`` is everything in one process; ``migrate``, ``api``, ``engine`` and ``worker`` are
the same parts one at a time, for many machines; ``keys`` makes and revokes API keys.

The command owns the process's signals: SIGINT and SIGTERM cancel the command's task once, so
the parts stop in the reverse order they started (API, engine and workers first, each with its
own grace period; the embedded database last). A second signal is only acknowledged; a third
ends the process at once (an embedded database left running is restarted by the next ``run``).

Failures a user can fix (a bad setting, a database that does not answer, a port in use) print
one line to stderr and exit 2; a traceback means a bug in Duetime.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

from core.errors import DuetimeError, StorageUnavailable
from duetime.embedded_pg import EmbeddedPostgres, running_dsn
from duetime.settings import (
    Settings,
    SettingsError,
    format_shard_set,
    parse_shard_set,
    redact_dsn,
    unknown_variables,
)
from storage.base import Registry
from storage.migrate import migrate
from storage.postgres import PostgresStore
from storage.shardmap import ShardMap

log = logging.getLogger("duetime")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
DEV_OWNER = "dev"
OWNER_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


# --- argument parsing ---------------------------------------------------------------------------


def _owner(text: str) -> str:
    if OWNER_PATTERN.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid owner name: use 1 to 64 letters, digits, '_', '.' or '-'"
        )
    return text


def _shards(text: str) -> str:
    try:
        parse_shard_set(text, variable="--shards")
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def _version() -> str:
    try:
        return metadata.version("duetime")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duetime",
        description="Cron and one-off jobs fired on the second. Settings come from DUETIME_* "
        "environment variables (docs/settings.md).",
    )
    parser.add_argument("--version", action="version", version=f"duetime {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "run",
        help="everything in one process: migrations, API, engine for every shard, workers",
        description="Run the API, an engine for DUETIME_SHARDS and workers in one process. Without "
        "DUETIME_DATABASE_URL it starts an embedded PostgreSQL under DUETIME_DATA_DIR.",
    )
    sub.add_parser("migrate", help="apply database migrations to every database of the shard map")
    sub.add_parser("api", help="serve the HTTP API only")
    engine = sub.add_parser("engine", help="claim and fire due runs for a set of shards")
    engine.add_argument(
        "--shards", type=_shards, help="logical shards to serve, e.g. 0-7 or 0-3,8 (default DUETIME_SHARDS)"
    )
    sub.add_parser("worker", help="take fired runs from the run queue and call their targets")
    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="make an API key (and the owner's signing secret)")
    create.add_argument("--owner", required=True, type=_owner, help="owner name: 1-64 of [A-Za-z0-9_.-]")
    create.add_argument(
        "--json", action="store_true", help='print {"owner", "api_key", "signing_secret"} alone'
    )
    revoke = keys_sub.add_parser("revoke", help="revoke a key, given whole or by its prefix")
    revoke.add_argument("key", metavar="KEY_OR_PREFIX")
    return parser


# --- commands -----------------------------------------------------------------------------------


def database_settings(settings: Settings) -> Settings:
    """Settings naming a database: the configured one, else the embedded one a ``run`` holds."""
    if not settings.uses_embedded_pg:
        return settings
    dsn = running_dsn(settings.data_dir)
    if dsn is None:
        raise SettingsError(
            "DUETIME_DATABASE_URL",
            None,
            "a PostgreSQL URL (or DUETIME_SHARD_DSNS); no `duetime run` is holding an embedded "
            f"database in {settings.data_dir} either",
        )
    return settings.with_database(dsn)


async def migrate_all(settings: Settings, out: Callable[[str], None]) -> None:
    """Bring every distinct database of the shard map to the current schema."""
    for dsn, shards in ShardMap.from_dsns(settings.shard_dsns()).databases().items():
        async with _about(dsn):
            applied = await migrate(dsn)
        where = f"{redact_dsn(dsn)} (shards {format_shard_set(set(shards))})"
        out(f"{where}: applied {', '.join(applied)}" if applied else f"{where}: already up to date")


async def _open_store(settings: Settings) -> PostgresStore:
    shard_map = ShardMap.from_dsns(settings.shard_dsns())
    async with _about(shard_map.home):
        return await PostgresStore.open(shard_map, pool_size=2)


@contextlib.asynccontextmanager
async def _about(dsn: str) -> AsyncIterator[None]:
    """A failure to reach or use one database names it (without its password)."""
    try:
        yield
    except Exception as exc:
        message = _describe(exc)
        if message is None or isinstance(exc, SettingsError):
            raise
        raise DuetimeError(f"database {redact_dsn(dsn)}: {message}", code="database_error") from exc


async def ensure_dev_key(store: Registry, path: Path) -> tuple[str, str]:
    """The ``dev`` owner's key and signing secret, the same across restarts while the key is valid.

    The clear key is kept in ``path`` (mode 0600) because the database holds only its hash; a key
    the database no longer knows (a new database, a revoked key) is replaced by a fresh one.
    """
    saved = _read_dev_key(path)
    if saved is not None and await store.owner_for_key(saved[0]) == DEV_OWNER:
        current = await store.signing_secret(DEV_OWNER)
        return saved[0], current if current is not None else saved[1]
    api_key, secret = await store.create_api_key(DEV_OWNER)
    _write_dev_key(path, api_key, secret)
    return api_key, secret


def _read_dev_key(path: Path) -> tuple[str, str] | None:
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        return str(saved["api_key"]), str(saved["signing_secret"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_dev_key(path: Path, api_key: str, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"owner": DEV_OWNER, "api_key": api_key, "signing_secret": secret}, f)
        f.write("\n")
    os.replace(tmp, path)


async def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    await migrate_all(database_settings(settings), _say)
    return EXIT_OK


async def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    store = await _open_store(database_settings(settings))
    try:
        if args.keys_command == "create":
            api_key, secret = await store.create_api_key(args.owner)
            if args.json:
                _say(json.dumps({"owner": args.owner, "api_key": api_key, "signing_secret": secret}))
            else:
                _say(f'API key for owner "{args.owner}": {api_key}')
                _say(f"Webhook signing secret: {secret}")
                _say("The key is shown only now; keep it. Send it as 'Authorization: Bearer <key>'.")
            return EXIT_OK
        revoked = await store.revoke_api_key(args.key)
    finally:
        await store.close()
    if revoked == 0:
        print(f"duetime: no active API key is {args.key!r} or starts with it", file=sys.stderr)
        return EXIT_FAILED
    _say(f"revoked {revoked} API key{'s' if revoked != 1 else ''}")
    return EXIT_OK


async def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from duetime import app

    async with AsyncExitStack() as stack:
        dsn_override: str | None = None
        if settings.uses_embedded_pg:
            pg = await stack.enter_async_context(EmbeddedPostgres(settings.data_dir))
            dsn_override = pg.dsn
            settings = settings.with_database(pg.dsn)
            log.info("embedded PostgreSQL in %s at %s", pg.root, pg.dsn)
        await migrate_all(settings, log.info)
        store = await _open_store(settings)
        try:
            api_key, secret = await ensure_dev_key(store, settings.data_dir / "dev-key")
        finally:
            await store.close()

        def ready(url: str) -> None:
            _say(f"Duetime is serving {url}")
            _say(f'API key for owner "{DEV_OWNER}": {api_key}')
            _say(f'Webhook signing secret for owner "{DEV_OWNER}": {secret}')
            if dsn_override is not None:
                _say(f"Database: embedded PostgreSQL at {dsn_override} (stops with Duetime)")

        try:
            await app.run_all(settings, dsn_override=dsn_override, ready=ready)
        finally:
            _signals.get().guard()
    return EXIT_OK


async def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    from duetime import app

    await app.run_api(settings, ready=lambda url: _say(f"Duetime API is serving {url}"))
    return EXIT_OK


async def cmd_engine(settings: Settings, args: argparse.Namespace) -> int:
    from duetime import app

    await app.run_engine(
        settings,
        ready=lambda url: _say(
            f"Duetime engine {settings.engine_id} is running; health and metrics on {url}"
        ),
    )
    return EXIT_OK


async def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    from duetime import app

    if settings.run_queue == "inprocess":
        raise SettingsError(
            "DUETIME_RUN_QUEUE",
            settings.run_queue,
            "'nats' for separate worker processes; with the in-process run queue the workers run "
            "inside `duetime engine` and `duetime run`",
        )
    # Looked up by name: the app gains run_worker together with the NATS run queue.
    run_worker: Callable[[Settings], Awaitable[None]] | None = getattr(app, "run_worker", None)
    if run_worker is None:
        raise DuetimeError(
            "this version has no separate worker process yet; `duetime engine` runs its own workers"
        )
    await run_worker(settings)
    return EXIT_OK


Command = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]
COMMANDS: dict[str, Command] = {
    "run": cmd_run,
    "migrate": cmd_migrate,
    "api": cmd_api,
    "engine": cmd_engine,
    "worker": cmd_worker,
    "keys": cmd_keys,
}


# --- process plumbing ---------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, flush=True)


class _SignalStop:
    """SIGINT/SIGTERM cancel the command's task once, so its cleanup runs in order."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._count = 0

    def guard(self) -> None:
        """(Re)install the handlers for the running task; a part that installed its own (the app
        does, while it serves) removes them when it returns, and the rest of the shutdown, the
        embedded database's stop, must stay guarded."""
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig, task)

    def _on_signal(self, sig: signal.Signals, task: asyncio.Task[Any]) -> None:
        self._count += 1
        if self._count == 1:
            self.received = sig
            log.info("%s received: stopping (a third signal exits at once)", sig.name)
            task.cancel()
        elif self._count == 2:
            log.warning("still stopping; one more signal exits at once")
        else:
            os._exit(128 + sig)


_signals: contextvars.ContextVar[_SignalStop] = contextvars.ContextVar("duetime_signals")


async def _supervise(
    command: Command, settings: Settings, args: argparse.Namespace, stop: _SignalStop
) -> int:
    _signals.set(stop)
    stop.guard()
    return await command(settings, args)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _driver_error(exc: BaseException) -> bool:
    """An error raised by the database driver, recognised without importing it outside storage/."""
    return any(cls.__module__.split(".")[0] == "asyncpg" for cls in type(exc).__mro__)


def _describe(exc: BaseException) -> str | None:
    """One line for a failure the user can act on, or None for a bug (which keeps its traceback)."""
    if isinstance(exc, StorageUnavailable) and exc.__cause__ is not None:
        return f"{exc.message} ({type(exc.__cause__).__name__}: {exc.__cause__})"
    if isinstance(exc, DuetimeError):
        return exc.message
    if _driver_error(exc):
        return f"database error: {type(exc).__name__}: {exc}"
    if isinstance(exc, ConnectionError | TimeoutError):
        return f"cannot reach a server: {exc}"
    if isinstance(exc, OSError):
        return str(exc)
    return None


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    environ = dict(os.environ)
    if getattr(args, "shards", None):
        environ["DUETIME_SHARDS"] = args.shards
    try:
        settings = Settings.from_env(environ)
    except SettingsError as exc:
        print(f"duetime: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    _configure_logging(settings.log_level)
    for warning in unknown_variables(environ):
        log.warning("%s", warning)
    stop = _SignalStop()
    try:
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            return runner.run(_supervise(COMMANDS[args.command], settings, args, stop))
    except (asyncio.CancelledError, KeyboardInterrupt):
        if stop.received is not None:
            log.info("stopped")
            return EXIT_OK
        return 128 + signal.SIGINT
    except Exception as exc:
        message = _describe(exc)
        if message is None:
            raise
        print(f"duetime: {message}", file=sys.stderr)
        return EXIT_USAGE
