"""The ``duetime`` command: the composition root that turns settings into running parts.

``duetime run`` is everything in one process; ``migrate``, ``api``, ``engine`` and ``worker`` are
the same parts one at a time, for many machines; ``keys`` makes and revokes API keys.

The command owns the process's signals: SIGINT and SIGTERM cancel the command's task once, so
the parts stop in the reverse order they started (API, engine and workers first, each with its
own grace period; the embedded database last). A second signal is only acknowledged; a third
ends the process at once (an embedded database left running is restarted by the next ``run``).

Failures a user can fix (a bad setting, a database that does not answer, a port in use) print
one line to stderr and exit 2; a traceback means a bug in Duetime.

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
from typing import TYPE_CHECKING, Any

from duetime import apply as apply_file
from duetime._version import __version__
from duetime.client import DEFAULT_URL, DuetimeApiError, DuetimeClient, DuetimeConnectionError
from duetime.core.errors import DuetimeError, StorageUnavailable
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
from duetime.storage.base import Registry
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
    "aiohttp",
    "asyncpg",
    "hiredis",
    "msgpack",
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


async def cmd_shards(settings: Settings, args: argparse.Namespace) -> int:
    from duetime.storage.migrate import migrate
    from duetime.storage.postgres import move_shard

    settings = database_settings(settings)
    target = args.to.strip()
    if not target.lower().startswith(("postgresql://", "postgres://")):
        raise SettingsError("--to", target, "a PostgreSQL URL such as postgresql://user@host:5432/duetime")
    dsns = list(settings.shard_dsns())
    source = dsns[args.shard]
    async with _about(target):
        await migrate(target)
    async with _about(source):
        report = await move_shard(args.shard, source, target)
    dsns[args.shard] = target
    _say(
        f"moved shard {args.shard}: {report.jobs} jobs, {report.runs} runs, {report.idempotency_keys} "
        f"idempotency keys from {redact_dsn(source)} to {redact_dsn(target)}"
    )
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
    from duetime.storage.postgres.membership import MembershipStore

    settings = database_settings(settings)
    try:
        store = await _open_store(settings)
        try:
            async with _about(store.shard_map.home):
                records = await MembershipStore(store.home_pool).engines()
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

    ``--url`` before the action names the server; after ``create`` it names the job's webhook, as
    in the API's own spec. ``--server`` and ``--key`` are accepted in both places.
    """
    jobs = sub.add_parser(
        "jobs",
        help="register and manage jobs through the HTTP API (prints JSON)",
        description=f"Talk to a Duetime API as an owner. The server is --url/--server, else "
        f"${JOBS_URL_ENV}, else http://127.0.0.1:8080; the key is --key, else ${JOBS_KEY_ENV}. "
        "Answers are printed as JSON; an error prints the API's message and exits 2.",
    )
    jobs.add_argument("--url", "--server", dest="server", default=None, help="the API's base URL")
    jobs.add_argument("--key", default=None, help=f"API key (default ${JOBS_KEY_ENV})")
    jobs.add_argument("--timeout", type=float, default=30.0, help="seconds per call (default 30)")
    conn = argparse.ArgumentParser(add_help=False)
    conn.add_argument("--server", dest="server", default=argparse.SUPPRESS, help="the API's base URL")
    conn.add_argument("--key", default=argparse.SUPPRESS, help="API key")
    actions = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")

    create = actions.add_parser(
        "create",
        parents=[conn],
        help="register a job from a JSON spec (file or stdin) and/or flags",
        description="The spec is read from --file (- for stdin); the flags fill in or override "
        "its fields. Without a file, --url and one of --cron or --run-at make a webhook job.",
    )
    create.add_argument("-f", "--file", help="JSON job spec; - reads stdin")
    create.add_argument("--name", help="the job's name")
    create.add_argument("--url", dest="target_url", help="webhook URL (target type webhook)")
    create.add_argument("--method", choices=("POST", "PUT"), help="webhook method (default POST)")
    create.add_argument("--cron", help="cron expression (5 or 6 fields, or @daily etc.)")
    create.add_argument("--tz", help="IANA zone for --cron (default UTC)")
    create.add_argument("--run-at", help="one run at this RFC 3339 time")
    create.add_argument("--payload", help="JSON sent as the body of each run")
    create.add_argument(
        "--overlap", choices=("allow", "skip", "buffer_one"), help="when a run is still in flight"
    )
    create.add_argument("--idempotency-key", help="makes the create safe to repeat (and to retry)")

    for action in ("get", *_JOB_ACTIONS):
        verb = "cancel (DELETE)" if action == "cancel" else action
        actions.add_parser(action, parents=[conn], help=f"{verb} a job").add_argument("job_id", metavar="ID")
    for name, what in (("list", "jobs"), ("runs", "a job's runs, newest first")):
        listing = actions.add_parser(name, parents=[conn], help=f"list {what}")
        if name == "runs":
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
        parents=[conn],
        help="create or update named jobs from a JSON or YAML list (a deploy script's jobs)",
        description="Each job in FILE (a JSON or YAML list of specs, each with a unique name) is PUT "
        "by name: created, updated, or left as it is. --prune cancels the owner's named jobs the "
        "file does not list; --dry-run prints the plan and changes nothing.",
    )
    apply.add_argument("file", metavar="FILE", help="JSON, or YAML (.yaml/.yml); - reads stdin")
    apply.add_argument("--prune", action="store_true", help="cancel named jobs that are not in FILE")
    apply.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")

    bulk = actions.add_parser(
        "bulk", parents=[conn], help="pause, resume or cancel every job carrying some labels"
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

    backfill = actions.add_parser(
        "backfill",
        parents=[conn],
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


class _JobsUsage(Exception):
    """A mistake on the command line itself (exit 2 before any call is made)."""


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _JobsUsage(f"{what} is not valid JSON: {exc}") from None


def _spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
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
        target: dict[str, Any] = {"type": "webhook", **(given if isinstance(given, dict) else {})}
        if args.target_url is not None:
            target["url"] = args.target_url
        if args.method is not None:
            target["method"] = args.method
        spec["target"] = target
    schedule = _schedule_from_args(args.cron, args.tz, args.run_at)
    if schedule is not None:
        spec["schedule"] = schedule
    if args.payload is not None:
        spec["payload"] = _json_arg(args.payload, "--payload")
    if args.overlap is not None:
        spec["overlap"] = args.overlap
    if not spec:
        raise _JobsUsage("give the job spec with --file (- for stdin) or flags such as --url and --cron")
    return spec


def _schedule_from_args(
    cron: str | None, tz: str | None, run_at: str | None, **extra: str | None
) -> dict[str, Any] | None:
    if cron is not None and run_at is not None:
        raise _JobsUsage("give either --cron or --run-at, not both")
    if run_at is not None:
        if tz is not None:
            raise _JobsUsage("--tz applies to --cron; a --run-at carries its own UTC offset")
        return {"run_at": run_at}
    if cron is None:
        if tz is not None or any(v is not None for v in extra.values()):
            raise _JobsUsage("--tz, --dst-gap and --dst-overlap go with --cron")
        return None
    schedule: dict[str, Any] = {"cron": cron}
    if tz is not None:
        schedule["timezone"] = tz
    schedule.update({k: v for k, v in extra.items() if v is not None})
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
    done = apply_file.apply(client, steps, say=_say)
    _say(", ".join(f"{n} {what}" for what, n in done.items()))


def _bulk(client: DuetimeClient, args: argparse.Namespace) -> dict[str, Any]:
    labels = _labels_arg(args.label)
    total = {"matched": 0, "changed": 0, "more": False, "calls": 0}
    while True:
        result = getattr(client, f"bulk_{args.bulk_action}")(labels, state=args.state)
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
        return client.create_job(_spec_from_args(args), idempotency_key=args.idempotency_key).raw
    if action == "get":
        return client.get_job(args.job_id).raw
    if action in _JOB_ACTIONS:
        return getattr(client, f"{action}_job")(args.job_id).raw
    if action == "backfill":
        return client.backfill_job(args.job_id, args.start, args.end).raw
    if action in ("list", "runs"):
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
        if args.all:
            runs = client.iter_runs(args.job_id, page_size=args.limit)
            return {"items": [run.raw for run in runs], "next_cursor": None}
        return client.list_runs(args.job_id, limit=args.limit, cursor=args.cursor).raw
    schedule = _schedule_from_args(
        args.cron, args.tz, args.run_at, dst_gap=args.dst_gap, dst_overlap=args.dst_overlap
    )
    if (schedule is None) == (args.job_id is None):
        raise _JobsUsage("preview takes a job ID or a schedule (--cron or --run-at), one of the two")
    if schedule is not None:
        return client.preview_schedule(schedule, count=args.count, start=args.start).raw
    return client.preview_job(args.job_id, count=args.count, start=args.start).raw


def run_jobs(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``duetime jobs …``: synchronous, no settings or database needed, only the API's URL and key."""
    url = args.server or environ.get(JOBS_URL_ENV) or DEFAULT_URL
    key = args.key or environ.get(JOBS_KEY_ENV) or None
    try:
        client = DuetimeClient(url, key, timeout_s=args.timeout)
        answer = _jobs_call(client, args)
    except _JobsUsage as exc:
        print(f"duetime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DuetimeApiError as exc:
        where = f", field {exc.field}" if exc.field else ""
        hint = f" (set ${JOBS_KEY_ENV} or pass --key)" if exc.status == 401 and key is None else ""
        print(f"duetime: {exc.message}{hint} [{exc.code}{where}; HTTP {exc.status}]", file=sys.stderr)
        return EXIT_USAGE
    except DuetimeConnectionError as exc:
        print(f"duetime: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # e.g. --timeout 0
        print(f"duetime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if answer is not None:
        print(json.dumps(answer, indent=2, ensure_ascii=False), flush=True)
    return EXIT_OK


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


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


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
