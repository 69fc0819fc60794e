"""The ``duetime`` command: the composition root that turns settings into running parts.

``duetime run`` is everything in one process; ``migrate``, ``api``, ``engine`` and ``worker`` are
the same parts one at a time, for many machines; ``keys`` makes and revokes API keys.

The command owns the process's signals: SIGINT and SIGTERM cancel the command's task once, so
the parts stop in the reverse order they started (API, engine and workers first, each with its
own grace period; the embedded database last). A second signal is only acknowledged; a third
ends the process at once (an embedded database left running is restarted by the next ``run``).

Exit status: 0 success; 1 the operation failed (an API error such as 404, a database or server
that does not answer, a port in use, a refused shard move); 2 a usage or settings error (a bad
flag, a bad ``DUETIME_*`` value, a missing setting). A failure prints one line to stderr; a
traceback means a bug in Duetime.

The server's libraries (asyncpg, aiohttp, NATS, Redis, ...) come with the ``server`` extra, so
this module imports none of them at the top: ``duetime --version`` and ``duetime jobs …`` work
after a plain ``pip install duetime``, and a server command without the extra says which install
command is missing instead of failing with a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import importlib.util
import json
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from duetime import apply as apply_file
from duetime import logs
from duetime._version import __version__
from duetime.client import DEFAULT_URL, DuetimeApiError, DuetimeClient, DuetimeConnectionError
from duetime.core.codec import format_time
from duetime.core.errors import DuetimeError, NotFound, StorageUnavailable
from duetime.core.ids import SHARDS
from duetime.embedded_pg import EmbeddedPostgres, running_dsn
from duetime.settings import (
    Settings,
    SettingsError,
    format_shard_dsns,
    format_shard_set,
    parse_shard_set,
    redact_dsn,
    unknown_variables,
)
from duetime.storage.ports import ApiKeyInfo, Registry
from duetime.storage.shardmap import ShardMap

if TYPE_CHECKING:
    from duetime.storage.postgres import PostgresStore

log = logging.getLogger("duetime")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
DEV_OWNER = "dev"
OWNER_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SERVER_INSTALL = "pip install 'duetime[server]'"
# What the server commands import, as import names: the `server` extra of pyproject.toml (a test
# keeps the two equal). Looked up with find_spec, so a check costs no import.
SERVER_MODULES = (
    "aiohappyeyeballs",
    "aiohttp",
    "asyncpg",
    "hiredis",
    "httptools",
    "msgpack",
    "msgspec",
    "nats",
    "prometheus_client",
    "redis",
    "tzdata",
    "uvloop",
)


# --- argument parsing ---------------------------------------------------------------------------


def _owner(text: str) -> str:
    if OWNER_PATTERN.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid owner name: use 1 to 64 letters, digits, '_', '.' or '-'"
        )
    return text


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    """``90s``, ``30m``, ``24h``, ``7d`` or plain seconds; at most 365 days."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write it like 90s, 30m, 24h or 7d")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if seconds > 365 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than a year")
    return seconds


def _shards(text: str) -> str:
    try:
        parse_shard_set(text, variable="--shards")
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duetime",
        description="Cron and one-off jobs fired on the second. Settings come from DUETIME_* "
        "environment variables (docs/settings.md).",
    )
    parser.add_argument("--version", action="version", version=f"duetime {__version__}")
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
        "--shards",
        type=_shards,
        help="restrict the logical shards this engine may serve, e.g. 0-7 or 0-3,8 (default "
        "DUETIME_SHARDS, all 16); the live engines deal the shards among themselves",
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
    listing = keys_sub.add_parser("list", help="list API keys (their prefixes; keys are never stored)")
    listing.add_argument("--owner", type=_owner, help="only this owner's keys")
    listing.add_argument("--all", action="store_true", help="revoked keys too")
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    rotate = keys_sub.add_parser(
        "rotate-secret",
        help="give an owner a new webhook signing secret; the old one still signs for --grace",
        description="During the grace every webhook carries a webhook-signature under the new and "
        "the old secret (space-separated, as Standard Webhooks allows), so receivers can switch to "
        "the new secret one at a time. Workers pick the new secret up within a minute.",
    )
    rotate.add_argument("--owner", required=True, type=_owner, help="owner name")
    rotate.add_argument(
        "--grace",
        type=_duration,
        default=24 * 3600.0,
        metavar="DURATION",
        help="how long the old secret keeps signing: 90s, 30m, 24h, 7d (default 24h)",
    )
    rotate.add_argument(
        "--json",
        action="store_true",
        help='print {"owner", "signing_secret", "previous_valid_until"} alone',
    )
    _add_shards_parser(sub)
    _add_cluster_parser(sub)
    _add_jobs_parser(sub)
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
    from duetime.storage.migrate import migrate

    for dsn, shards in ShardMap.from_dsns(settings.shard_dsns()).databases().items():
        async with _about(dsn):
            applied = await migrate(dsn)
        where = f"{redact_dsn(dsn)} (shards {format_shard_set(set(shards))})"
        out(f"{where}: applied {', '.join(applied)}" if applied else f"{where}: already up to date")


async def _open_store(settings: Settings) -> PostgresStore:
    from duetime.storage.postgres import PostgresStore

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
        if args.keys_command == "list":
            return _print_keys(await store.list_api_keys(args.owner, revoked=args.all), as_json=args.json)
        if args.keys_command == "rotate-secret":
            try:
                rotation = await store.rotate_signing_secret(args.owner, args.grace)
            except NotFound as exc:
                print(f"duetime: {exc.message}", file=sys.stderr)
                return EXIT_FAILED
            until = format_time(rotation.previous_valid_until)
            if args.json:
                _say(
                    json.dumps(
                        {
                            "owner": rotation.owner,
                            "signing_secret": rotation.signing_secret,
                            "previous_valid_until": until,
                        }
                    )
                )
            else:
                _say(f'New webhook signing secret for owner "{rotation.owner}": {rotation.signing_secret}')
                _say(
                    f"The previous secret also signs every webhook until {until}; move receivers before then."
                )
            return EXIT_OK
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


def _print_keys(keys: Sequence[ApiKeyInfo], *, as_json: bool) -> int:
    rows = [
        {
            "prefix": k.prefix,
            "owner": k.owner,
            "created_at": format_time(k.created_at),
            "revoked_at": format_time(k.revoked_at) if k.revoked_at is not None else None,
        }
        for k in keys
    ]
    if as_json:
        _say(json.dumps(rows, indent=2))
        return EXIT_OK
    _say(_table(rows, ("prefix", "owner", "created_at", "revoked_at")))
    return EXIT_OK


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Plain aligned columns (no borders), "-" for a missing value: easy to read and to grep."""
    cells = [[str(r.get(c)) if r.get(c) is not None else "-" for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


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
    await app.run_worker(
        settings, ready=lambda url: _say(f"Duetime worker is running; health and metrics on {url}")
    )
    return EXIT_OK


# --- shards: moving a logical shard between primaries ---------------------------------------------


def _add_shards_parser(sub: Any) -> None:
    shards = sub.add_parser("shards", help="move a logical shard to another PostgreSQL primary")
    actions = shards.add_subparsers(dest="shards_command", required=True, metavar="ACTION")
    move = actions.add_parser(
        "move",
        help="copy one shard's rows to another database and delete them at the source",
        description="Refuses while any row of the shard is claimed or running: first restart the "
        "engines serving it without it. Writes to the source database wait while the rows are "
        "copied. Afterwards set the printed DUETIME_SHARD_DSNS on every process and restart them "
        "(docs/operations.md).",
    )
    move.add_argument("--shard", required=True, type=int, choices=range(1, SHARDS), metavar="N")
    move.add_argument("--to", required=True, metavar="DSN", help="the target database's PostgreSQL URL")
    move.add_argument(
        "--dry-run",
        action="store_true",
        help="check that the move can be made and say what it would copy; change nothing",
    )


async def cmd_shards(settings: Settings, args: argparse.Namespace) -> int:
    from duetime.storage.migrate import migrate
    from duetime.storage.postgres import move_shard

    settings = database_settings(settings)
    target = args.to.strip()
    if not target.lower().startswith(("postgresql://", "postgres://")):
        raise SettingsError("--to", target, "a PostgreSQL URL such as postgresql://user@host:5432/duetime")
    dsns = list(settings.shard_dsns())
    source = dsns[args.shard]
    where = f"from {redact_dsn(source)} to {redact_dsn(target)}"
    if args.dry_run:
        _say(f"dry run: checking shard {args.shard} {where}; nothing will be changed")
    else:
        _say(f"moving shard {args.shard} {where}")
        _say(f"migrating {redact_dsn(target)}")
        async with _about(target):
            await migrate(target)
    async with _about(source):
        report = await move_shard(
            args.shard, source, target, dry_run=args.dry_run, progress=lambda line: _say(f"  {line}")
        )
    dsns[args.shard] = target
    counts = f"{report.jobs} jobs, {report.runs} runs, {report.idempotency_keys} idempotency keys"
    if args.dry_run:
        _say(f"would move shard {args.shard}: {counts} {where}")
        _say("After the move, this would be set on every api, engine and worker process:")
        _say(f"DUETIME_SHARD_DSNS={redact_dsn(format_shard_dsns(dsns))}")
        return EXIT_OK
    _say(f"moved shard {args.shard}: {counts} {where}")
    _say("Set this on every api, engine and worker process and restart them:")
    _say(f"DUETIME_SHARD_DSNS={redact_dsn(format_shard_dsns(dsns))}")
    return EXIT_OK


# --- cluster: the membership and the dealing -------------------------------------------------------


def _add_cluster_parser(sub: Any) -> None:
    cluster = sub.add_parser("cluster", help="the engines of the cluster and the shards dealt to them")
    actions = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    status = actions.add_parser(
        "status",
        help="live engines, the shards each serves, shards with fewer engines than DUETIME_SHARD_REPLICAS",
        description="Reads the membership from the home database (shard 0's) named by "
        "DUETIME_DATABASE_URL or DUETIME_SHARD_DSNS.",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object (api-v1.md) alone")


async def cmd_cluster(settings: Settings, args: argparse.Namespace) -> int:
    from duetime.clusterstatus import ClusterStatus

    settings = database_settings(settings)
    try:
        store = await _open_store(settings)
        try:
            async with _about(store.shard_map.home):
                records = await store.list_engines()
        finally:
            await store.close()
    except SettingsError:
        raise
    except DuetimeError as exc:
        print(f"duetime: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    status = ClusterStatus.of(records, settings.shard_replicas)
    _say(json.dumps(status.as_json()) if args.json else status.table())
    return EXIT_OK


# --- jobs: the owner's client on the command line -------------------------------------------------

JOBS_URL_ENV = "DUETIME_URL"
JOBS_KEY_ENV = "DUETIME_API_KEY"
_JOB_ACTIONS = ("pause", "resume", "trigger", "cancel", "replay")


def _add_jobs_parser(sub: Any) -> None:
    """``duetime jobs …``: every call goes through ``duetime.client``, output is the API's JSON.

    ``--url`` before the action names the server; after ``create`` (and ``update``) it names the
    job's webhook, as it always has. ``--webhook-url`` says the latter without the ambiguity and
    ``--server`` the former; ``--server`` and ``--key``/``--api-key`` are accepted in both places.
    """
    jobs = sub.add_parser(
        "jobs",
        help="register and manage jobs through the HTTP API (prints JSON)",
        description=f"Talk to a Duetime API as an owner. The server is --url/--server, else "
        f"${JOBS_URL_ENV}, else http://127.0.0.1:8080; the key is --key, else ${JOBS_KEY_ENV}. "
        "Answers are printed as JSON. Exit status: 0 success, 1 the API answered an error (its "
        "message is printed) or could not be reached, 2 a usage error.",
    )
    jobs.add_argument("--url", "--server", dest="server", default=None, help="the API's base URL")
    jobs.add_argument(
        "--api-key",
        "--key",
        dest="key",
        default=None,
        help=f"API key (default ${JOBS_KEY_ENV}); visible to other users in `ps`, prefer the variable",
    )
    jobs.add_argument(
        "--api-key-file",
        dest="key_file",
        default=None,
        metavar="PATH",
        help="read the API key from the first line of PATH (- for stdin)",
    )
    jobs.add_argument("--timeout", type=float, default=30.0, help="seconds per call (default 30)")
    jobs.add_argument(
        "-o",
        "--output",
        choices=("json", "table"),
        default="json",
        help="json (default: the API's answer, for scripts) or table (for a person)",
    )
    conn = argparse.ArgumentParser(add_help=False)
    conn.add_argument("--server", dest="server", default=argparse.SUPPRESS, help="the API's base URL")
    conn.add_argument("--api-key", "--key", dest="key", default=argparse.SUPPRESS, help="API key")
    conn.add_argument(
        "-o", "--output", choices=("json", "table"), default=argparse.SUPPRESS, help="json or table"
    )
    actions = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    # Every action that changes a job takes a reason, which the job's change history keeps.
    why = argparse.ArgumentParser(add_help=False)
    why.add_argument(
        "--reason",
        metavar="TEXT",
        help="why this change is made (at most 500 characters); kept in the job's change history "
        "(duetime jobs changes ID)",
    )

    create = actions.add_parser(
        "create",
        parents=[conn, why],
        help="register a job from a JSON spec (file or stdin) and/or flags",
        description="The spec is read from --file (- for stdin); the flags fill in or override "
        "its fields. Without a file, --webhook-url (or --url) and one of --cron, --every or --run-at "
        "make a webhook job.",
    )
    update = actions.add_parser(
        "update",
        parents=[conn, why],
        help="change a job (PATCH): the fields of --file and the flags, the rest unchanged",
        description="Sends a PATCH: only the fields given change. A --cron or --run-at replaces the "
        "whole schedule; --webhook-url/--method change only those fields of the job's target.",
    )
    update.add_argument("job_id", metavar="ID")
    for parser in (create, update):
        parser.add_argument("-f", "--file", help="JSON job spec (a patch, for update); - reads stdin")
        parser.add_argument("--name", help="the job's name")
        parser.add_argument(
            "--webhook-url", "--url", dest="target_url", help="webhook URL (target type webhook)"
        )
        parser.add_argument("--method", choices=("POST", "PUT"), help="webhook method (default POST)")
        parser.add_argument("--cron", help="cron expression (5 or 6 fields, or @daily etc.)")
        parser.add_argument("--tz", help="IANA zone for --cron (default UTC)")
        parser.add_argument("--run-at", help="one run at this RFC 3339 time")
        parser.add_argument("--every", help="an interval such as 90m, 1h30m or 7d (exact elapsed time)")
        parser.add_argument("--start-at", help="RFC 3339 first occurrence of --every (default: now)")
        parser.add_argument(
            "--exclude",
            action="append",
            metavar="DATE[..DATE]",
            help="a local date YYYY-MM-DD, or an inclusive range FROM..TO, on which --cron or --every "
            "is not due (in --tz); repeat for more",
        )
        parser.add_argument("--payload", help="JSON sent as the body of each run")
        parser.add_argument(
            "--overlap", choices=("allow", "skip", "buffer_one"), help="when a run is still in flight"
        )
        parser.add_argument(
            "--on-failure-url",
            metavar="URL",
            help="webhook that receives the job's failure events (job.failing, job.paused, job.recovered)",
        )
        parser.add_argument(
            "--on-failure-after",
            type=int,
            metavar="N",
            help="send job.failing after N consecutive failed occurrences (default 1; with --on-failure-url)",
        )
        parser.add_argument(
            "--pause-after-failures",
            type=int,
            metavar="N",
            help="pause the job after N consecutive failed occurrences",
        )
    create.add_argument("--idempotency-key", help="makes the create safe to repeat (and to retry)")

    for action in ("get", *_JOB_ACTIONS):
        verb = "cancel (DELETE)" if action == "cancel" else action
        parents = [conn] if action == "get" else [conn, why]
        one = actions.add_parser(action, parents=parents, help=f"{verb} a job")
        one.add_argument("job_id", metavar="ID")
        if action == "pause":
            _add_pause_flags(one)
    for name, what in (
        ("list", "jobs"),
        ("runs", "a job's runs, newest first"),
        ("changes", "a job's change history, newest first: who changed what, when and why"),
    ):
        listing = actions.add_parser(name, parents=[conn], help=f"list {what}")
        if name in ("runs", "changes"):
            listing.add_argument("job_id", metavar="ID")
        else:
            listing.add_argument("--state", choices=("scheduled", "paused", "completed", "cancelled", "dead"))
            listing.add_argument(
                "--label", action="append", metavar="KEY=VALUE", help="only jobs with this label (repeatable)"
            )
            listing.add_argument("--name-prefix", help="only jobs whose name starts with this")
        listing.add_argument("--limit", type=int, help="page size, 1-1000")
        listing.add_argument("--cursor", help="next_cursor of the previous page")
        listing.add_argument("--all", action="store_true", help="follow next_cursor to the end")

    apply = actions.add_parser(
        "apply",
        parents=[conn, why],
        help="create or update named jobs from a JSON or YAML list (a deploy script's jobs)",
        description="Each job in FILE (a JSON or YAML list of specs, each with a unique name) is PUT "
        "by name: created, updated, or left as it is. --prune cancels the owner's named jobs the "
        "file does not list; --dry-run prints the plan and changes nothing. Each change carries "
        "--reason, by default 'duetime jobs apply FILE'.",
    )
    apply.add_argument("file", metavar="FILE", help="JSON, or YAML (.yaml/.yml); - reads stdin")
    apply.add_argument("--prune", action="store_true", help="cancel named jobs that are not in FILE")
    apply.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")

    bulk = actions.add_parser(
        "bulk", parents=[conn, why], help="pause, resume or cancel every job carrying some labels"
    )
    bulk.add_argument("bulk_action", choices=("pause", "resume", "cancel"), metavar="pause|resume|cancel")
    bulk.add_argument(
        "--label",
        action="append",
        metavar="KEY=VALUE",
        required=True,
        help="jobs with this label (repeatable)",
    )
    bulk.add_argument("--state", choices=("scheduled", "paused", "completed", "cancelled", "dead"))
    bulk.add_argument(
        "--once", action="store_true", help="one call (at most DUETIME_BULK_MAX jobs); default: until done"
    )
    _add_pause_flags(bulk, only_pause=True)

    backfill = actions.add_parser(
        "backfill",
        parents=[conn, why],
        help="run every occurrence of a recurring job in [--from, --to) again",
    )
    backfill.add_argument("job_id", metavar="ID")
    backfill.add_argument("--from", dest="start", required=True, help="RFC 3339 instant, inclusive")
    backfill.add_argument("--to", dest="end", required=True, help="RFC 3339 instant, exclusive")

    preview = actions.add_parser(
        "preview",
        parents=[conn],
        help="the next occurrences of a job (by ID) or of a schedule (--cron/--run-at)",
    )
    preview.add_argument("job_id", metavar="ID", nargs="?")
    preview.add_argument("--count", type=int, help="how many, 1-100 (default 10)")
    preview.add_argument("--from", dest="start", help="RFC 3339 instant to preview from (default now)")
    preview.add_argument("--cron", help="preview this cron expression instead of a job")
    preview.add_argument("--tz", help="IANA zone for --cron")
    preview.add_argument("--dst-gap", choices=("shift", "skip"))
    preview.add_argument("--dst-overlap", choices=("first", "both"))
    preview.add_argument("--run-at", help="preview a one-off schedule")
    preview.add_argument("--every", help="preview an interval such as 90m")
    preview.add_argument("--start-at", help="RFC 3339 first occurrence of --every")
    preview.add_argument("--exclude", action="append", metavar="DATE[..DATE]", help="excluded local dates")


def _add_pause_flags(parser: argparse.ArgumentParser, *, only_pause: bool = False) -> None:
    what = " (bulk pause only)" if only_pause else ""
    parser.add_argument(
        "--note",
        metavar="TEXT",
        help=f"shown in the job's paused while it is paused (≤ 500 characters){what}",
    )
    parser.add_argument(
        "--until",
        metavar="TIME",
        help=f"RFC 3339: the server resumes the job by itself then (its misfire policy applies){what}",
    )


class _JobsUsage(Exception):
    """A mistake on the command line itself (exit 2 before any call is made)."""


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _JobsUsage(f"{what} is not valid JSON: {exc}") from None


def _spec_from_args(args: argparse.Namespace, *, patch: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if args.file is not None:
        try:
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        except OSError as exc:
            raise _JobsUsage(f"cannot read {args.file}: {exc.strerror or exc}") from None
        loaded = _json_arg(text, "the spec from stdin" if args.file == "-" else args.file)
        if not isinstance(loaded, dict):
            raise _JobsUsage("the job spec must be a JSON object")
        spec = loaded
    if args.name is not None:
        spec["name"] = args.name
    if args.target_url is not None or args.method is not None:
        given = spec.get("target")
        # For a patch, only the given fields of the target: the rest is the job's (see update).
        base: dict[str, Any] = {} if patch else {"type": "webhook"}
        target: dict[str, Any] = {**base, **(given if isinstance(given, dict) else {})}
        if args.target_url is not None:
            target["url"] = args.target_url
        if args.method is not None:
            target["method"] = args.method
        spec["target"] = target
    schedule = _schedule_from_args(
        args.cron, args.tz, args.run_at, every=args.every, start_at=args.start_at, exclude=args.exclude
    )
    if schedule is not None:
        spec["schedule"] = schedule
    if args.payload is not None:
        spec["payload"] = _json_arg(args.payload, "--payload")
    if args.overlap is not None:
        spec["overlap"] = args.overlap
    if args.on_failure_url is not None:
        spec["on_failure"] = {"target": {"type": "webhook", "url": args.on_failure_url}}
    if args.on_failure_after is not None:
        on_failure = spec.get("on_failure")
        if not isinstance(on_failure, dict):
            raise _JobsUsage("--on-failure-after goes with --on-failure-url (or an on_failure in --file)")
        spec["on_failure"] = {**on_failure, "after": args.on_failure_after}
    if args.pause_after_failures is not None:
        spec["pause_after_failures"] = args.pause_after_failures
    if not spec:
        if patch:
            raise _JobsUsage("give the fields to change with --file (- for stdin) or flags such as --cron")
        raise _JobsUsage(
            "give the job spec with --file (- for stdin) or flags such as --webhook-url and --cron"
        )
    return spec


def _exclude_from_args(items: list[str]) -> list[Any]:
    """``YYYY-MM-DD`` stays a date; ``FROM..TO`` becomes an inclusive range (the API checks both)."""
    out: list[Any] = []
    for item in items:
        first, dots, last = item.partition("..")
        out.append({"from": first, "to": last} if dots else item)
    return out


def _schedule_from_args(
    cron: str | None,
    tz: str | None,
    run_at: str | None,
    *,
    every: str | None = None,
    start_at: str | None = None,
    exclude: list[str] | None = None,
    **extra: str | None,
) -> dict[str, Any] | None:
    given = [flag for flag, value in (("--cron", cron), ("--every", every), ("--run-at", run_at)) if value]
    if len(given) > 1:
        raise _JobsUsage(f"give one of --cron, --every or --run-at, not {' and '.join(given)}")
    if start_at is not None and every is None:
        raise _JobsUsage("--start-at goes with --every")
    if run_at is not None:
        if tz is not None or exclude:
            raise _JobsUsage(
                "--tz and --exclude apply to --cron and --every; a --run-at carries its own offset"
            )
        return {"run_at": run_at}
    if every is not None:
        if any(v is not None for v in extra.values()):
            raise _JobsUsage("--dst-gap and --dst-overlap go with --cron: an --every interval ignores DST")
        schedule: dict[str, Any] = {"every": every}
        if start_at is not None:
            schedule["start_at"] = start_at
    elif cron is not None:
        schedule = {"cron": cron}
        schedule.update({k: v for k, v in extra.items() if v is not None})
    else:
        if tz is not None or exclude or any(v is not None for v in extra.values()):
            raise _JobsUsage("--tz, --exclude, --dst-gap and --dst-overlap go with --cron or --every")
        return None
    if tz is not None:
        schedule["timezone"] = tz
    if exclude:
        schedule["exclude"] = _exclude_from_args(exclude)
    return schedule


def _labels_arg(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for text in values or []:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise _JobsUsage(f"--label takes KEY=VALUE, for example --label team=billing (got {text!r})")
        out[key] = value
    return out


def _apply(client: DuetimeClient, args: argparse.Namespace) -> None:
    try:
        specs = apply_file.read_file(args.file, sys.stdin.read)
    except apply_file.ApplyError as exc:
        raise _JobsUsage(str(exc)) from None
    steps = apply_file.plan(client, specs, prune=args.prune)
    if args.dry_run:
        for step in steps:
            _say(apply_file.describe(step))
        counts = {
            a: sum(1 for s in steps if s.action == a) for a in ("create", "update", "unchanged", "cancel")
        }
        _say("plan: " + ", ".join(f"{n} to {a}" for a, n in counts.items()) + " (dry run: nothing changed)")
        return
    source = "stdin" if args.file == "-" else Path(args.file).name
    reason = args.reason if args.reason is not None else f"duetime jobs apply {source}"
    done = apply_file.apply(client, steps, say=_say, reason=reason)
    _say(", ".join(f"{n} {what}" for what, n in done.items()))


def _bulk(client: DuetimeClient, args: argparse.Namespace) -> dict[str, Any]:
    labels = _labels_arg(args.label)
    if args.bulk_action != "pause" and (args.note is not None or args.until is not None):
        raise _JobsUsage("--note and --until go with bulk pause")
    total = {"matched": 0, "changed": 0, "more": False, "calls": 0}
    while True:
        if args.bulk_action == "pause":
            result = client.bulk_pause(
                labels, state=args.state, note=args.note, until=args.until, reason=args.reason
            )
        else:
            result = getattr(client, f"bulk_{args.bulk_action}")(labels, state=args.state, reason=args.reason)
        total["matched"] += result.matched
        total["changed"] += result.changed
        total["more"] = result.more
        total["calls"] += 1
        # Each call goes on where the last stopped (changed jobs no longer match); a call that
        # changed nothing while more matched would loop for ever, so it ends the run too.
        if args.once or not result.more or result.changed == 0:
            return total


def _jobs_call(client: DuetimeClient, args: argparse.Namespace) -> Any:
    """The JSON to print for one ``jobs`` action (None: the action printed its own lines)."""
    action = args.jobs_command
    if action == "apply":
        _apply(client, args)
        return None
    if action == "bulk":
        return _bulk(client, args)
    if action == "create":
        return client.create_job(
            _spec_from_args(args), idempotency_key=args.idempotency_key, reason=args.reason
        ).raw
    if action == "update":
        patch = _spec_from_args(args, patch=True)
        target = patch.get("target")
        flagged = args.target_url is not None or args.method is not None
        if flagged and isinstance(target, dict) and "type" not in target:
            # PATCH replaces the target whole: start from the job's own (its header values come
            # back as the "<redacted>" placeholder, which the API keeps as they are).
            patch["target"] = {**client.get_job(args.job_id).raw["target"], **target}
        return client.update_job(args.job_id, patch, reason=args.reason).raw
    if action == "get":
        return client.get_job(args.job_id).raw
    if action == "pause":
        return client.pause_job(args.job_id, note=args.note, until=args.until, reason=args.reason).raw
    if action in _JOB_ACTIONS:
        return getattr(client, f"{action}_job")(args.job_id, reason=args.reason).raw
    if action == "backfill":
        return client.backfill_job(args.job_id, args.start, args.end, reason=args.reason).raw
    if action in ("list", "runs", "changes"):
        if args.all and args.cursor is not None:
            raise _JobsUsage("--all starts at the first page; leave out --cursor")
        if action == "list":
            labels = _labels_arg(args.label) or None
            if args.all:
                jobs = client.iter_jobs(
                    state=args.state, page_size=args.limit, labels=labels, name_prefix=args.name_prefix
                )
                return {"items": [job.raw for job in jobs], "next_cursor": None}
            return client.list_jobs(
                state=args.state,
                limit=args.limit,
                cursor=args.cursor,
                labels=labels,
                name_prefix=args.name_prefix,
            ).raw
        if action == "changes":
            if args.all:
                changes = client.iter_changes(args.job_id, page_size=args.limit)
                return {"items": [change.raw for change in changes], "next_cursor": None}
            return client.changes(args.job_id, limit=args.limit, cursor=args.cursor).raw
        if args.all:
            runs = client.iter_runs(args.job_id, page_size=args.limit)
            return {"items": [run.raw for run in runs], "next_cursor": None}
        return client.list_runs(args.job_id, limit=args.limit, cursor=args.cursor).raw
    schedule = _schedule_from_args(
        args.cron,
        args.tz,
        args.run_at,
        every=args.every,
        start_at=args.start_at,
        exclude=args.exclude,
        dst_gap=args.dst_gap,
        dst_overlap=args.dst_overlap,
    )
    if (schedule is None) == (args.job_id is None):
        raise _JobsUsage("preview takes a job ID or a schedule (--cron, --every or --run-at), one of the two")
    if schedule is not None:
        return client.preview_schedule(schedule, count=args.count, start=args.start).raw
    return client.preview_job(args.job_id, count=args.count, start=args.start).raw


def _jobs_key(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The key from --api-key-file, --api-key/--key (with a warning), else $DUETIME_API_KEY.

    A key in argv is readable by every user of the machine through `ps` and /proc; the flag
    keeps working (the contract names it) but says so, and the file/stdin and the variable don't.
    """
    if args.key_file is not None:
        if args.key is not None:
            raise _JobsUsage("give the key once: --api-key-file or --api-key, not both")
        try:
            if args.key_file == "-":
                line = sys.stdin.readline()
            else:
                with open(args.key_file, encoding="utf-8") as f:
                    line = f.readline()
        except OSError as exc:
            raise _JobsUsage(f"cannot read the API key from {args.key_file}: {exc.strerror}") from None
        key = line.strip()
        if not key:
            raise _JobsUsage(f"no API key on the first line of {args.key_file}")
        return key
    if args.key is not None:
        print(
            f"duetime: warning: an API key on the command line is visible to other users of this "
            f"machine (ps); set ${JOBS_KEY_ENV} or use --api-key-file - instead",
            file=sys.stderr,
        )
        return str(args.key)
    return environ.get(JOBS_KEY_ENV) or None


def run_jobs(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``duetime jobs …``: synchronous, no settings or database needed, only the API's URL and key."""
    url = args.server or environ.get(JOBS_URL_ENV) or DEFAULT_URL
    try:
        key = _jobs_key(args, environ)
        client = DuetimeClient(url, key, timeout_s=args.timeout)
        answer = _jobs_call(client, args)
    except _JobsUsage as exc:
        print(f"duetime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DuetimeApiError as exc:
        where = f", field {exc.field}" if exc.field else ""
        hint = f" (set ${JOBS_KEY_ENV} or use --api-key-file)" if exc.status == 401 and key is None else ""
        print(f"duetime: {exc.message}{hint} [{exc.code}{where}; HTTP {exc.status}]", file=sys.stderr)
        return EXIT_FAILED
    except DuetimeConnectionError as exc:
        print(f"duetime: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:  # e.g. --timeout 0
        print(f"duetime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if answer is not None:  # None: the action printed its own report (jobs apply)
        text = (
            render_table(answer)
            if args.output == "table"
            else json.dumps(answer, indent=2, ensure_ascii=False)
        )
        print(text, flush=True)
    return EXIT_OK


# --- `-o table`: the same answers, for a person ---------------------------------------------------

# The columns a person scans first, per kind of row; any other row shows its scalar fields.
_TABLE_COLUMNS: Final = {
    "job": ("id", "name", "state", "next_run_at", "schedule", "target"),
    "run": ("job_id", "scheduled_for", "attempt", "outcome", "status_code", "started_at", "error"),
    "occurrence": ("at", "wall_time", "due_at"),
    "change": ("seq", "at", "action", "actor", "spec_version", "reason", "diff"),
}
_CELL_MAX: Final = 48


def _row_kind(row: Mapping[str, Any]) -> str | None:
    if "seq" in row and "action" in row:
        return "change"
    if "state" in row and "schedule" in row:
        return "job"
    if "outcome" in row and "attempt" in row:
        return "run"
    if "at" in row and ("wall_time" in row or "due_at" in row):
        return "occurrence"
    return None


def _cell(value: Any) -> str:
    """One cell: scalars as they are, a schedule or target by its gist, anything else as JSON."""
    if value is None:
        return "-"
    if isinstance(value, Mapping):
        for key in ("cron", "every", "run_at", "url", "topic"):
            if key in value:
                text = str(value[key])
                zone = value.get("timezone")
                return f"{text} ({zone})" if key == "cron" and zone else text
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    elif isinstance(value, list):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = str(value).replace("\n", " ")
    return text if len(text) <= _CELL_MAX else text[: _CELL_MAX - 1] + "…"


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _change_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A change record for a person: who as one word (the key's id, or duetime), the diff as the
    fields it changed (``-o json`` has the values)."""
    actor = row.get("actor") or {}
    who = actor.get("key_id") or actor.get("type")
    diff = row.get("diff") or {}
    fields = "(whole spec)" if "" in diff else " ".join(diff) or None
    return {**row, "actor": who, "diff": fields}


def render_table(answer: Any) -> str:
    """A page (``items``), a preview (``occurrences``) or a list as rows and columns; a single
    object (a job, a backfill, a bulk answer) as field/value lines. ``-o json`` stays the format
    for scripts: the table drops nested detail."""
    rows: Any = None
    footer = ""
    if isinstance(answer, Mapping):
        for key in ("items", "occurrences"):
            if isinstance(answer.get(key), list):
                rows = answer[key]
                if answer.get("next_cursor"):
                    footer = f"\n(more: --cursor {answer['next_cursor']})"
                break
    elif isinstance(answer, list):
        rows = answer
    if rows is None:
        if not isinstance(answer, Mapping):
            return _cell(answer)
        return _grid(("field", "value"), [(str(k), _cell(v)) for k, v in answer.items()])
    if not rows:
        return "(none)" + footer
    dicts = [r for r in rows if isinstance(r, Mapping)]
    if len(dicts) != len(rows):
        return "\n".join(_cell(r) for r in rows) + footer
    kind = _row_kind(dicts[0])
    if kind == "change":
        dicts = [_change_row(r) for r in dicts]
    if kind is not None:
        header = [c for c in _TABLE_COLUMNS[kind] if any(c in r for r in dicts)]
    else:
        header = [k for k, v in dicts[0].items() if not isinstance(v, Mapping | list)]
    return _grid(header, [[_cell(r.get(c)) for c in header] for r in dicts]) + footer


Command = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]
COMMANDS: dict[str, Command] = {
    "run": cmd_run,
    "migrate": cmd_migrate,
    "api": cmd_api,
    "engine": cmd_engine,
    "worker": cmd_worker,
    "keys": cmd_keys,
    "shards": cmd_shards,
    "cluster": cmd_cluster,
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


def missing_server_module() -> str | None:
    """The first library of the server extra that is not installed, or None."""
    for name in SERVER_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it, or a module left half-imported
            found = False
        if not found:
            return name
    return None


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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    environ = dict(os.environ)
    if args.command == "jobs":
        return run_jobs(args, environ)
    missing = missing_server_module()
    if missing is not None:
        print(
            f"duetime: '{args.command}' needs the server's libraries ({missing} is not installed): "
            f"{SERVER_INSTALL}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if getattr(args, "shards", None):
        environ["DUETIME_SHARDS"] = args.shards
    try:
        settings = Settings.from_env(environ)
    except SettingsError as exc:
        print(f"duetime: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(settings.log_level, settings.log_format)
    for warning in unknown_variables(environ):
        log.warning("%s", warning)
    if args.command in ("run", "engine", "worker"):
        from duetime.workers import tracing

        try:
            tracing.configure(environ)  # before any part starts: a missing extra is a settings error
        except tracing.TracingUnavailable as exc:
            print(f"duetime: {exc}", file=sys.stderr)
            return EXIT_USAGE
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
        # A setting the command cannot work with is the user's to fix before trying again; any
        # other failure (a database or port, a refused move) is the operation failing.
        return EXIT_USAGE if isinstance(exc, SettingsError) else EXIT_FAILED
