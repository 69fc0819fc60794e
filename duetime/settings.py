"""One settings object per process, read once from ``DUETIME_*`` environment variables.

Every knob lives here, with its default and its meaning in the field's metadata, so the table in
``docs/settings.md`` is rendered from this file (``render_settings_table``) and a test keeps the two
equal. Values are checked when the process starts: a typo must stop the process with a message
that names the variable, the value and what is expected, never fall back to a default silently.
An empty variable counts as unset, so ``DUETIME_X=`` in a shell or compose file means "default".
"""

from __future__ import annotations

import difflib
import math
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Any, Literal, cast

from duetime.core.errors import DuetimeError
from duetime.core.ids import SHARDS
from duetime.core.topics import OWNER_PLACEHOLDER, TopicPolicy, TopicRule

IPNetwork = IPv4Network | IPv6Network
RunQueueKind = Literal["inprocess", "nats"]

ENV_PREFIX = "DUETIME_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Variables read by other parts of the tree (tests, load test) rather than by ``Settings``.
FOREIGN_PREFIXES = ("DUETIME_TEST_", "DUETIME_LOADTEST_")
# Read by the client side (`duetime jobs`, duetime.client) rather than by a server process: a shell
# that exports them for the CLI must not make every server warn about them.
CLIENT_VARIABLES = ("DUETIME_URL", "DUETIME_API_KEY")


class SettingsError(DuetimeError):
    """A ``DUETIME_*`` variable holds a value Duetime cannot use; the message says how to fix it."""

    code = "invalid_setting"

    def __init__(self, variable: str, value: object, expected: str) -> None:
        if value is None:
            message = f"{variable} is not set: expected {expected}"
        else:
            shown = repr(redact_dsn(value)) if isinstance(value, str) else repr(value)
            message = f"{variable}={shown} is not valid: expected {expected}"
        super().__init__(message, field=variable)
        self.variable = variable
        self.value = value
        self.expected = expected


# --- helpers that other modules use -----------------------------------------------------------

_PASSWORD_IN_NETLOC = re.compile(r"(?P<head>://[^/@:]*:)[^/@]*@")
_PASSWORD_IN_QUERY = re.compile(r"(?P<head>[?&]password=)[^&]*", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """A DSN fit for logs and error messages: the password, if any, replaced by ``***``."""
    out = _PASSWORD_IN_NETLOC.sub(r"\g<head>***@", dsn)
    return _PASSWORD_IN_QUERY.sub(r"\g<head>***", out)


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def _parse_range(variable: str, text: str, whole: str) -> range:
    match = _RANGE.match(text)
    if match is None:
        raise SettingsError(
            variable,
            whole,
            f"shard numbers or ranges like '0-7,9' (each 0-{SHARDS - 1}); {text!r} is neither",
        )
    lo = int(match.group(1))
    hi = int(match.group(2)) if match.group(2) is not None else lo
    if hi < lo:
        raise SettingsError(variable, whole, f"ranges written low-high; {text.strip()!r} runs backwards")
    if hi >= SHARDS:
        raise SettingsError(
            variable, whole, f"shard numbers from 0 to {SHARDS - 1}; {text.strip()!r} goes past {SHARDS - 1}"
        )
    return range(lo, hi + 1)


def parse_shard_set(text: str, *, variable: str = "DUETIME_SHARDS") -> frozenset[int]:
    """``"0-7,9"`` → {0..7, 9}. Overlapping parts are allowed (it is a set); an empty set is not."""
    shards: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            raise SettingsError(
                variable, text, "a comma-separated list of shard numbers or ranges like '0-7,9'"
            )
        shards.update(_parse_range(variable, part, text))
    return frozenset(shards)


def format_shard_set(shards: frozenset[int] | set[int]) -> str:
    """The canonical, shortest spelling of a shard set: ``{0,1,2,3,9}`` → ``"0-3,9"``."""
    parts: list[str] = []
    ordered = sorted(shards)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# A new entry starts at a comma followed by "N=" or "N-M=". Splitting there, and not at every comma,
# keeps multi-host DSNs (postgresql://h1,h2/db) in one piece.
_ENTRY_SPLIT = re.compile(r",(?=\s*\d+\s*(?:-\s*\d+\s*)?=)")
_DSN_SCHEMES = ("postgresql://", "postgres://")


def _check_dsn(variable: str, whole: str, dsn: str) -> str:
    if not dsn.lower().startswith(_DSN_SCHEMES):
        raise SettingsError(variable, whole, "a PostgreSQL URL such as postgresql://user@host:5432/duetime")
    return dsn


def parse_shard_dsns(text: str, *, variable: str = "DUETIME_SHARD_DSNS") -> tuple[str, ...]:
    """``"0-7=postgresql://a/db,8-15=postgresql://b/db"`` → 16 DSNs, index = logical shard.

    Every shard must be named exactly once: a gap would leave jobs with nowhere to live, an overlap
    would let two databases both believe they own a shard.
    """
    expected_form = f"entries like '0-7=postgresql://a/db,8-{SHARDS - 1}=postgresql://b/db'"
    owner_of: dict[int, str] = {}
    dsn_of: dict[int, str] = {}
    for entry in _ENTRY_SPLIT.split(text):
        key, sep, dsn = entry.partition("=")
        if not sep:
            raise SettingsError(variable, text, f"{expected_form}; {entry.strip()!r} has no '='")
        dsn = dsn.strip()
        if not dsn:
            raise SettingsError(variable, text, f"{expected_form}; shards {key.strip()!r} have no DSN")
        _check_dsn(variable, text, dsn)
        for shard in _parse_range(variable, key, text):
            if shard in owner_of:
                raise SettingsError(
                    variable,
                    text,
                    f"every shard mapped exactly once; shard {shard} is in both "
                    f"{owner_of[shard]!r} and {key.strip()!r}",
                )
            owner_of[shard] = key.strip()
            dsn_of[shard] = dsn
    missing = frozenset(range(SHARDS)) - owner_of.keys()
    if missing:
        raise SettingsError(
            variable,
            text,
            f"every shard 0-{SHARDS - 1} mapped exactly once; "
            f"shards {format_shard_set(missing)} are not mapped",
        )
    return tuple(dsn_of[s] for s in range(SHARDS))


def format_shard_dsns(dsns: list[str] | tuple[str, ...]) -> str:
    """16 DSNs (index = shard) → the shortest DUETIME_SHARD_DSNS value: ``0-7=a,8-15=b``."""
    entries: list[str] = []
    start = 0
    for shard in range(1, len(dsns) + 1):
        if shard == len(dsns) or dsns[shard] != dsns[start]:
            key = str(start) if shard - 1 == start else f"{start}-{shard - 1}"
            entries.append(f"{key}={dsns[start]}")
            start = shard
    return ",".join(entries)


def default_engine_id(shards: frozenset[int]) -> str:
    """Host name plus shard set: stable across restarts, so a restarted engine takes back its claims."""
    return f"{socket.gethostname()}:{format_shard_set(shards)}"


# --- value parsers: (variable, raw text) → value, or SettingsError ------------------------------

Parser = Callable[[str, str], Any]


def _integer(lo: int, hi: int | None = None) -> Parser:
    bounds = f"an integer from {lo} to {hi}" if hi is not None else f"an integer ≥ {lo}"

    def parse(variable: str, raw: str) -> int:
        try:
            value = int(raw.strip(), 10)
        except ValueError:
            raise SettingsError(variable, raw, bounds) from None
        if value < lo or (hi is not None and value > hi):
            raise SettingsError(variable, raw, bounds)
        return value

    return parse


def _seconds(*, allow_zero: bool = False) -> Parser:
    bounds = "a number of seconds ≥ 0" if allow_zero else "a number of seconds > 0"

    def parse(variable: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise SettingsError(variable, raw, bounds) from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise SettingsError(variable, raw, bounds)
        return value

    return parse


def _positive_number(variable: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise SettingsError(variable, raw, "a number > 0") from None
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(variable, raw, "a number > 0")
    return value


def _boolean(variable: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SettingsError(variable, raw, "a boolean: 1/true/yes/on or 0/false/no/off")


def _database_url(variable: str, raw: str) -> str:
    return _check_dsn(variable, raw, raw.strip())


def _url(*schemes: str) -> Parser:
    listed = ", ".join(f"{s}://" for s in schemes)

    def parse(variable: str, raw: str) -> str:
        text = raw.strip()
        scheme, sep, rest = text.partition("://")
        if not sep or scheme.lower() not in schemes or not rest:
            raise SettingsError(variable, raw, f"a URL starting with {listed}")
        return text

    return parse


def _host(variable: str, raw: str) -> str:
    text = raw.strip()
    if not text or any(c.isspace() for c in text) or "/" in text:
        raise SettingsError(
            variable, raw, "a host name or IP address to listen on, e.g. 127.0.0.1 or 0.0.0.0"
        )
    return text


def _cidrs(variable: str, raw: str) -> tuple[IPNetwork, ...]:
    out: list[IPNetwork] = []
    for item in raw.split(","):
        text = item.strip()
        if not text:
            continue
        try:
            out.append(ip_network(text, strict=True))
        except ValueError:
            raise SettingsError(
                variable,
                raw,
                f"comma-separated networks in CIDR form with no host bits set "
                f"(e.g. 10.20.0.0/16,fd12:3456::/48); {text!r} is not one",
            ) from None
    return tuple(out)


def _engine_id(variable: str, raw: str) -> str:
    text = raw.strip()
    if len(text) > 200 or any(not c.isprintable() or c.isspace() for c in text):
        raise SettingsError(variable, raw, "1 to 200 printable characters without spaces")
    return text


def _shards(variable: str, raw: str) -> frozenset[int]:
    return parse_shard_set(raw, variable=variable)


def _shard_map(variable: str, raw: str) -> tuple[str, ...]:
    return parse_shard_dsns(raw, variable=variable)


def _run_queue(variable: str, raw: str) -> str:
    text = raw.strip().lower()
    if text not in ("inprocess", "nats"):
        raise SettingsError(
            variable, raw, "'inprocess' (one process) or 'nats' (NATS JetStream, across machines)"
        )
    return text


_SUBJECT = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def _subject(variable: str, raw: str) -> str:
    text = raw.strip()
    if _SUBJECT.match(text) is None or len(text) > 100:
        raise SettingsError(
            variable, raw, "a NATS subject prefix of dot-separated tokens of letters, digits, '_' or '-'"
        )
    return text


def _topic_rule(variable: str, raw: str) -> TopicRule:
    try:
        return TopicRule(raw.strip().lower())
    except ValueError:
        raise SettingsError(variable, raw, "one of " + ", ".join(r.value for r in TopicRule)) from None


def _topic_prefix(variable: str, raw: str) -> str:
    text = raw.strip()
    if OWNER_PLACEHOLDER not in text or any(c.isspace() for c in text) or len(text) > 200:
        raise SettingsError(variable, raw, "a prefix containing {owner}, without spaces, e.g. '{owner}.'")
    return text


def _topic_allowlist(variable: str, raw: str) -> tuple[str, ...]:
    items = tuple(p.strip() for p in raw.split(",") if p.strip())
    for item in items:
        if any(c.isspace() for c in item) or "*" in item[:-1]:
            raise SettingsError(variable, raw, "comma-separated topics, each with at most one * at its end")
    return items


def _token(variable: str, raw: str) -> str:
    text = raw.strip()
    if not 16 <= len(text) <= 512 or any(not 0x21 <= ord(c) <= 0x7E for c in text):
        raise SettingsError(variable, "<hidden>", "16 to 512 printable ASCII characters without spaces")
    return text


def _log_level(variable: str, raw: str) -> str:
    text = raw.strip().upper()
    if text not in LOG_LEVELS:
        raise SettingsError(variable, raw, "one of " + ", ".join(LOG_LEVELS))
    return text


def _log_format(variable: str, raw: str) -> str:
    text = raw.strip().lower()
    if text not in ("text", "json"):
        raise SettingsError(variable, raw, "'text' (for a terminal) or 'json' (one object per line)")
    return text


def _path(variable: str, raw: str) -> Path:
    return Path(raw.strip()).expanduser()


def _meta(env: str, doc: str, parse: Parser, *, shown: str | None = None) -> dict[str, Any]:
    """Field metadata: the variable, its parser, its meaning and how its default reads in the docs."""
    return {"env": env, "doc": doc, "parse": parse, "shown": shown}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a Duetime process can be told, checked as a whole when it is built."""

    database_url: str | None = field(
        default=None,
        metadata=_meta(
            "DUETIME_DATABASE_URL",
            "The PostgreSQL database holding all 16 logical shards. Unset (and no DUETIME_SHARD_DSNS): "
            "`duetime run` starts an embedded PostgreSQL under DUETIME_DATA_DIR; `duetime keys` and "
            "`duetime migrate` use that embedded one while it runs. "
            "Set this or DUETIME_SHARD_DSNS, not both.",
            _database_url,
            shown="unset",
        ),
    )
    shard_map: tuple[str, ...] | None = field(
        default=None,
        metadata=_meta(
            "DUETIME_SHARD_DSNS",
            "Spreads the 16 logical shards over several PostgreSQL primaries: "
            "`0-7=postgresql://a/db,8-15=postgresql://b/db`. Every shard 0-15 must be named exactly once. "
            "Owners and API keys live in shard 0's database.",
            _shard_map,
            shown="unset",
        ),
    )
    http_host: str = field(
        default="127.0.0.1",
        metadata=_meta(
            "DUETIME_HTTP_HOST",
            "Address the HTTP API listens on; `0.0.0.0` to accept connections from other machines.",
            _host,
        ),
    )
    http_port: int = field(
        default=8080,
        metadata=_meta(
            "DUETIME_HTTP_PORT", "TCP port of the HTTP API; 0 picks a free port.", _integer(0, 65535)
        ),
    )
    http_header_timeout_s: float = field(
        default=10.0,
        metadata=_meta(
            "DUETIME_HTTP_HEADER_TIMEOUT_S",
            "Seconds a connection has, from when it opens or its previous answer was sent, to deliver "
            "a complete request line and headers; then it is closed. This is also how long an idle "
            "keep-alive connection stays open (put a reverse proxy's upstream keep-alive below it).",
            _seconds(),
            shown="10",
        ),
    )
    http_body_timeout_s: float = field(
        default=30.0,
        metadata=_meta(
            "DUETIME_HTTP_BODY_TIMEOUT_S",
            "Seconds a client has to send a request body once its headers are in; a slower one is "
            "answered 408 `request_timeout` and the connection is closed.",
            _seconds(),
            shown="30",
        ),
    )
    metrics_token: str | None = field(
        default=None,
        metadata=_meta(
            "DUETIME_METRICS_TOKEN",
            "When set, `/metrics` answers only requests carrying `Authorization: Bearer <this "
            "token>` (401 otherwise). Unset: `/metrics` is open to whoever reaches its port.",
            _token,
            shown="unset",
        ),
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata=_meta(
            "DUETIME_METRICS_HOST",
            "With DUETIME_METRICS_PORT: the address the separate `/metrics` listener binds.",
            _host,
        ),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=_meta(
            "DUETIME_METRICS_PORT",
            "When set, `/metrics` is served only on its own listener (DUETIME_METRICS_HOST:this "
            "port; 0 picks a free one) and no longer on the API's port, so it can stay on a private "
            "interface. Unset: `/metrics` is on DUETIME_HTTP_PORT.",
            _integer(0, 65535),
            shown="unset",
        ),
    )
    nats_url: str | None = field(
        default=None,
        metadata=_meta(
            "DUETIME_NATS_URL",
            "NATS server for `queue` targets with broker `nats` and for DUETIME_RUN_QUEUE=nats.",
            _url("nats", "tls", "ws", "wss"),
            shown="unset",
        ),
    )
    redis_url: str | None = field(
        default=None,
        metadata=_meta(
            "DUETIME_REDIS_URL",
            "Redis server for `queue` targets with broker `redis` (one stream per topic).",
            _url("redis", "rediss", "unix"),
            shown="unset",
        ),
    )
    webhook_allow_private: bool = field(
        default=False,
        metadata=_meta(
            "DUETIME_WEBHOOK_ALLOW_PRIVATE",
            "1 lets webhooks reach loopback, private, link-local and metadata addresses (development only).",
            _boolean,
            shown="0",
        ),
    )
    webhook_allow_cidrs: tuple[IPNetwork, ...] = field(
        default=(),
        metadata=_meta(
            "DUETIME_WEBHOOK_ALLOW_CIDRS",
            "Comma-separated networks webhooks may reach although they are not public, "
            "e.g. `10.20.0.0/16,fd12:3456::/48`.",
            _cidrs,
            shown="empty",
        ),
    )
    topic_policy: TopicRule = field(
        default=TopicRule.OPEN,
        metadata=_meta(
            "DUETIME_TOPIC_POLICY",
            "Which queue topics an owner may use, besides the always-refused names of Duetime and "
            "the brokers: `open` (any), `owner_prefix` (topics start with DUETIME_TOPIC_PREFIX, so "
            "owners cannot reach each other's streams), `allowlist` (only DUETIME_TOPIC_ALLOWLIST). "
            "Checked at registration (422 `topic_not_allowed`) and again before every publish.",
            _topic_rule,
        ),
    )
    topic_prefix: str = field(
        default="{owner}.",
        metadata=_meta(
            "DUETIME_TOPIC_PREFIX",
            "DUETIME_TOPIC_POLICY=owner_prefix: the prefix every topic must start with; `{owner}` "
            "is replaced by the job's owner, e.g. `tenants.{owner}.`.",
            _topic_prefix,
        ),
    )
    topic_allowlist: tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "DUETIME_TOPIC_ALLOWLIST",
            "DUETIME_TOPIC_POLICY=allowlist: comma-separated topics an owner may use; `{owner}` is "
            "the owner and a trailing `*` matches any rest, e.g. `{owner}.*,shared.alerts`.",
            _topic_allowlist,
            shown="empty",
        ),
    )
    shards: frozenset[int] = field(
        default=frozenset(range(SHARDS)),
        metadata=_meta(
            "DUETIME_SHARDS",
            "Logical shards this engine may serve, e.g. `0-7` or `0-3,8` (to pin engines near a "
            "primary); which of them it serves is dealt among the live engines "
            "(DUETIME_SHARD_REPLICAS). `duetime engine --shards` overrides it.",
            _shards,
            shown=f"0-{SHARDS - 1}",
        ),
    )
    shard_replicas: int = field(
        default=2,
        metadata=_meta(
            "DUETIME_SHARD_REPLICAS",
            "How many engines serve each logical shard: the live engines deal the 16 shards among "
            "themselves so that each has this many (fewer only when fewer engines may serve it). "
            "Give every engine the same value; 16 puts every engine on every shard it may serve.",
            _integer(1, 16),
        ),
    )
    engine_id: str = field(
        default="",
        metadata=_meta(
            "DUETIME_ENGINE_ID",
            "Identity an engine claims under. A restarted engine with the same id takes back its claims "
            "at once instead of waiting for their leases to lapse; two live engines must never share one.",
            _engine_id,
            shown="host name + `:` + shard set",
        ),
    )
    lookahead_s: float = field(
        default=60.0,
        metadata=_meta(
            "DUETIME_LOOKAHEAD_S",
            "How far ahead the engine claims due rows into its timer wheel.",
            _seconds(),
            shown="60",
        ),
    )
    claim_batch: int = field(
        default=500,
        metadata=_meta("DUETIME_CLAIM_BATCH", "Rows claimed per query, per shard.", _integer(1, 100_000)),
    )
    poll_interval_s: float = field(
        default=1.0,
        metadata=_meta(
            "DUETIME_POLL_INTERVAL_S",
            "Pause between claim queries of a shard that had nothing (more) to claim.",
            _seconds(),
        ),
    )
    lease_s: float = field(
        default=30.0,
        metadata=_meta(
            "DUETIME_LEASE_S",
            "How long a fired run's lease lasts before a heartbeat extends it; a run whose holder died "
            "is retried after at most this long.",
            _seconds(),
            shown="30",
        ),
    )
    heartbeat_s: float = field(
        default=10.0,
        metadata=_meta(
            "DUETIME_HEARTBEAT_S",
            "How often a worker extends the lease of a call in flight, and an engine its membership "
            "heartbeat (re-reading the membership and its shards); at most half of DUETIME_LEASE_S.",
            _seconds(),
            shown="10",
        ),
    )
    janitor_interval_s: float = field(
        default=5.0,
        metadata=_meta(
            "DUETIME_JANITOR_INTERVAL_S",
            "How often the janitor looks for lapsed leases and makes their runs due again.",
            _seconds(),
            shown="5",
        ),
    )
    run_queue: RunQueueKind = field(
        default="inprocess",
        metadata=_meta(
            "DUETIME_RUN_QUEUE",
            "Where fired runs wait for a worker: `inprocess` (one process) or `nats` (JetStream, one "
            "subject per shard; needs DUETIME_NATS_URL).",
            _run_queue,
        ),
    )
    nats_run_subject: str = field(
        default="duetime.runs",
        metadata=_meta(
            "DUETIME_NATS_RUN_SUBJECT",
            "DUETIME_RUN_QUEUE=nats: subject prefix of the run queue (`<prefix>.<shard>`, one subject per "
            "logical shard). The work-queue stream is named after it (`duetime.runs` → `DUETIME_RUNS`) "
            "and created at start when missing; give two deployments on one NATS different prefixes.",
            _subject,
        ),
    )
    nats_ack_wait_s: float = field(
        default=30.0,
        metadata=_meta(
            "DUETIME_NATS_ACK_WAIT_S",
            "DUETIME_RUN_QUEUE=nats: how long a run fetched by a worker stays invisible to the other "
            "workers before NATS offers it again (a worker marks long calls in progress).",
            _seconds(),
            shown="30",
        ),
    )
    queue_wait_max_s: float = field(
        default=120.0,
        metadata=_meta(
            "DUETIME_QUEUE_WAIT_MAX_S",
            "DUETIME_RUN_QUEUE=nats: how long an engine keeps the lease of a run it published alive while "
            "no worker has taken it; after that the lease lapses and the janitor retries the run.",
            _seconds(),
            shown="120",
        ),
    )
    api_owner_rate: float = field(
        default=1000.0,
        metadata=_meta(
            "DUETIME_API_OWNER_RATE",
            "Requests per second one owner may make to one API process (a token bucket with bursts "
            "of twice that); more answer 429 with Retry-After. A request whose work grows with its "
            "input (a schedule preview, a schedule with many excluded dates, a bulk change, a "
            "backfill, an answer over 32 KiB) counts as several, by its measured cost "
            "(docs/security.md). 0 turns the limit off.",
            _seconds(allow_zero=True),
            shown="1000",
        ),
    )
    preview_workers: int = field(
        default=1,
        metadata=_meta(
            "DUETIME_PREVIEW_WORKERS",
            "Worker processes per API process that compute schedule previews, off the event loop "
            "and at a lower CPU priority (nice 10). Started at the first preview.",
            _integer(1, 64),
        ),
    )
    preview_max_waiting: int = field(
        default=8,
        metadata=_meta(
            "DUETIME_PREVIEW_MAX_WAITING",
            "Previews that may wait for a busy worker, per API process; one more answers 429 "
            "`server_busy` with Retry-After at once.",
            _integer(0, 10_000),
        ),
    )
    preview_per_owner: int = field(
        default=2,
        metadata=_meta(
            "DUETIME_PREVIEW_PER_OWNER",
            "Previews one owner may have running or waiting at once, per API process; one more "
            "answers 429 `rate_limited` with Retry-After, so one owner cannot fill the queue.",
            _integer(1, 10_000),
        ),
    )
    max_jobs_per_owner: int = field(
        default=100_000,
        metadata=_meta(
            "DUETIME_MAX_JOBS_PER_OWNER",
            "Active (scheduled or paused) jobs one owner may have; creating more answers 409 "
            "`job_limit_reached`. Counted per API process, refreshed every 10 s. 0 turns it off.",
            _integer(0),
        ),
    )
    max_job_bytes_per_owner: int = field(
        default=1 << 30,
        metadata=_meta(
            "DUETIME_MAX_JOB_BYTES_PER_OWNER",
            "Bytes the specs (payloads included) of one owner's active jobs may take as PostgreSQL "
            "stores them; creating more answers 409 `job_bytes_limit_reached`. Counted per API "
            "process like DUETIME_MAX_JOBS_PER_OWNER. 0 turns it off.",
            _integer(0),
            shown="1073741824 (1 GiB)",
        ),
    )
    max_pending_triggers: int = field(
        default=100,
        metadata=_meta(
            "DUETIME_MAX_PENDING_TRIGGERS",
            "Triggered runs (POST …/trigger) one job may have waiting behind the run in progress; "
            "one more answers 409 `too_many_triggers`. Also the replayed and backfilled runs a job "
            "may have waiting for a replay (POST …/replay with a body) to be taken: 409 "
            "`too_many_replays`.",
            _integer(1, 100_000),
        ),
    )
    min_cron_interval_s: int = field(
        default=0,
        metadata=_meta(
            "DUETIME_MIN_CRON_INTERVAL_S",
            "Refuse cron schedules that fire more often than this (422); 0 allows every second.",
            _integer(0, 86400),
        ),
    )
    run_at_horizon_days: int = field(
        default=3650,
        metadata=_meta(
            "DUETIME_RUN_AT_HORIZON_DAYS",
            "Refuse a `run_at` (or cron `start_at`) further ahead than this many days (422).",
            _integer(1, 36500),
        ),
    )
    backfill_max: int = field(
        default=1000,
        metadata=_meta(
            "DUETIME_BACKFILL_MAX",
            "A backfill queues at most this many occurrences per call (422 `backfill_too_large`), and "
            "a job has at most this many backfilled or overlapping runs waiting (409).",
            _integer(1, 100_000),
        ),
    )
    backfill_pace_per_s: float = field(
        default=10.0,
        metadata=_meta(
            "DUETIME_BACKFILL_PACE_PER_S",
            "`overlap: allow` backfills start at most this many runs a second each (skip and "
            "buffer_one backfills run one at a time).",
            _positive_number,
        ),
    )
    bulk_max: int = field(
        default=10_000,
        metadata=_meta(
            "DUETIME_BULK_MAX",
            "A bulk pause, resume or cancel changes at most this many jobs per call; the answer's "
            "`more` says when more matched (call again to go on).",
            _integer(1, 1_000_000),
        ),
    )
    run_retention_s: int = field(
        default=2_592_000,
        metadata=_meta(
            "DUETIME_RUN_RETENTION_S",
            "Run history older than this many seconds (by when the attempt finished) is deleted by "
            "the maintenance service (30 days). 0 keeps it forever. Failure events given up on "
            "(`on_failure`) are kept as long.",
            _integer(0),
        ),
    )
    finished_job_retention_s: int = field(
        default=2_592_000,
        metadata=_meta(
            "DUETIME_FINISHED_JOB_RETENTION_S",
            "A job that has been `completed`, `cancelled` or `dead` for longer than this many seconds "
            "is deleted with its history and Idempotency-Keys (it then answers 404). 0 keeps them.",
            _integer(0),
        ),
    )
    retention_batch: int = field(
        default=1000,
        metadata=_meta(
            "DUETIME_RETENTION_BATCH",
            "Rows the maintenance service deletes per statement (each its own short transaction).",
            _integer(1, 100_000),
        ),
    )
    retention_interval_s: float = field(
        default=60.0,
        metadata=_meta(
            "DUETIME_RETENTION_INTERVAL_S",
            "How often the maintenance service looks for expired history and finished jobs; a round "
            "goes on in batches until nothing old is left.",
            _seconds(),
            shown="60",
        ),
    )
    retention_pause_s: float = field(
        default=0.05,
        metadata=_meta(
            "DUETIME_RETENTION_PAUSE_S",
            "Pause between two delete batches, so a long clean-up leaves the database to the run path.",
            _seconds(allow_zero=True),
            shown="0.05",
        ),
    )
    processes: int = field(
        default=1,
        metadata=_meta(
            "DUETIME_PROCESSES",
            "`duetime run` only: how many processes share the work, each a full node (API on the same "
            "port, an engine for its share of the shards, its own workers). 1 keeps everything in one "
            "process; set it to the number of cores to use them all.",
            _integer(1, 64),
        ),
    )
    run_queue_max: int = field(
        default=10000,
        metadata=_meta(
            "DUETIME_RUN_QUEUE_MAX",
            "Runs that may wait in the run queue before the engine is held back (back-pressure); with "
            "DUETIME_RUN_QUEUE=nats, also the runs waiting in the stream for a worker (the stream counts "
            "messages, each a bundle of up to 64 runs: the engine counts them as holding as many runs "
            "as its last batch's messages did).",
            _integer(1),
        ),
    )
    worker_concurrency: int = field(
        default=1024,
        metadata=_meta(
            "DUETIME_WORKER_CONCURRENCY", "Target calls one worker process makes at once.", _integer(1)
        ),
    )
    target_concurrency: int = field(
        default=256,
        metadata=_meta(
            "DUETIME_TARGET_CONCURRENCY",
            "Calls in flight at once to one target host, per worker process.",
            _integer(1),
        ),
    )
    target_rate: float = field(
        default=10000.0,
        metadata=_meta(
            "DUETIME_TARGET_RATE",
            "Calls started per second to one target host, per worker process.",
            _positive_number,
            shown="10000",
        ),
    )
    worker_max_waiting: int = field(
        default=20000,
        metadata=_meta(
            "DUETIME_WORKER_MAX_WAITING",
            "Runs one worker process holds waiting for their host's room or a flow grant, besides "
            "the calls in flight; past it the worker takes no more runs off the run queue.",
            _integer(1),
        ),
    )
    target_backoff_after: int = field(
        default=10,
        metadata=_meta(
            "DUETIME_TARGET_BACKOFF_AFTER",
            "Calls to one host that time out or are refused in a row (no answer between) before "
            'the host backs off (docs/targets.md, "Target health").',
            _integer(1),
        ),
    )
    target_backoff_s: float = field(
        default=5.0,
        metadata=_meta(
            "DUETIME_TARGET_BACKOFF_S",
            "A host's first back-off; doubled each time its probe fails.",
            _seconds(),
            shown="5",
        ),
    )
    target_backoff_max_s: float = field(
        default=120.0,
        metadata=_meta(
            "DUETIME_TARGET_BACKOFF_MAX_S",
            "The longest back-off of a host between two probes.",
            _seconds(),
            shown="120",
        ),
    )
    shutdown_grace_s: float = field(
        default=30.0,
        metadata=_meta(
            "DUETIME_SHUTDOWN_GRACE_S",
            "On SIGTERM/SIGINT: how long calls in flight may finish before their leases are released.",
            _seconds(allow_zero=True),
            shown="30",
        ),
    )
    misfire_run_all_cap: int = field(
        default=100,
        metadata=_meta(
            "DUETIME_MISFIRE_RUN_ALL_CAP",
            "Most missed occurrences a `run_all` job catches up at once; older ones are recorded as skipped.",
            _integer(1),
        ),
    )
    max_skipped_recorded: int = field(
        default=100,
        metadata=_meta(
            "DUETIME_MAX_SKIPPED_RECORDED",
            "Most `skipped` history rows written for one job's missed stretch (the rest are counted).",
            _integer(0),
        ),
    )
    db_pool_size: int = field(
        default=10,
        metadata=_meta(
            "DUETIME_DB_POOL_SIZE", "Connections per database in each process's pool.", _integer(1, 1000)
        ),
    )
    db_statement_timeout_s: float = field(
        default=20.0,
        metadata=_meta(
            "DUETIME_DB_STATEMENT_TIMEOUT_S",
            "PostgreSQL's statement_timeout on every pooled session: a statement running longer is "
            "cancelled (and its work retried), so a hung one cannot hold its rows' locks for long. "
            "The client gives up 5 s after it too, for a primary cut off without a reset. 0: off.",
            _seconds(allow_zero=True),
            shown="20",
        ),
    )
    db_lock_timeout_s: float = field(
        default=10.0,
        metadata=_meta(
            "DUETIME_DB_LOCK_TIMEOUT_S",
            "PostgreSQL's lock_timeout on every pooled session: a statement that waits longer for "
            "a lock gives way and is retried. 0: off.",
            _seconds(allow_zero=True),
            shown="10",
        ),
    )
    db_idle_in_transaction_timeout_s: float = field(
        default=10.0,
        metadata=_meta(
            "DUETIME_DB_IDLE_IN_TRANSACTION_TIMEOUT_S",
            "PostgreSQL's idle_in_transaction_session_timeout on every pooled session: a process "
            "paused inside a transaction (stopped, swapped out, frozen by a debugger) loses the "
            "session, and with it the locks it held, after this long. Keep it well within "
            "DUETIME_LEASE_S. 0: off.",
            _seconds(allow_zero=True),
            shown="10",
        ),
    )
    db_connect_timeout_s: float = field(
        default=10.0,
        metadata=_meta(
            "DUETIME_DB_CONNECT_TIMEOUT_S",
            "How long opening a connection to PostgreSQL may take before it counts as failed.",
            _seconds(),
            shown="10",
        ),
    )
    db_keepalives_idle_s: float = field(
        default=5.0,
        metadata=_meta(
            "DUETIME_DB_KEEPALIVES_IDLE_S",
            "TCP keepalives on every session, set on the server's side of the connection (probes "
            "every 2 s after this much silence, 3 unanswered end it): a Duetime process that "
            "vanished without closing its connections (a host lost, a cable cut) has its sessions "
            "ended and its locks freed within about this plus 6 s. 0: the operating system's "
            "defaults (often two hours).",
            _seconds(allow_zero=True),
            shown="5",
        ),
    )
    clock_max_uncertainty_s: float = field(
        default=2.0,
        metadata=_meta(
            "DUETIME_CLOCK_MAX_UNCERTAINTY_S",
            "Every process times runs by the database's clock, measuring its offset on round trips "
            "to the home database (duetime_clock_offset_seconds). A sample whose round trip is "
            "longer than twice this is dropped; an engine fires nothing until it has one.",
            _seconds(),
            shown="2",
        ),
    )
    log_level: str = field(
        default="INFO",
        metadata=_meta("DUETIME_LOG_LEVEL", "One of " + ", ".join(LOG_LEVELS) + ".", _log_level),
    )
    log_format: str = field(
        default="text",
        metadata=_meta(
            "DUETIME_LOG_FORMAT",
            "`text` (for a terminal) or `json`: one JSON object per line with `ts` (RFC 3339), `level`, "
            "`logger`, `msg` and `request_id` while answering a request; the same in every process.",
            _log_format,
        ),
    )
    access_log: bool = field(
        default=False,
        metadata=_meta(
            "DUETIME_ACCESS_LOG",
            "Log one line per HTTP request answered (logger `duetime.access`: method, route, status, "
            "duration, request id), in the DUETIME_LOG_FORMAT of the process.",
            _boolean,
            shown="0",
        ),
    )
    data_dir: Path = field(
        default=Path(".duetime"),
        metadata=_meta(
            "DUETIME_DATA_DIR",
            "Local state of `duetime run`: the embedded PostgreSQL (`pg/`) and the dev key (`dev-key`).",
            _path,
            shown="./.duetime",
        ),
    )

    def __post_init__(self) -> None:
        if not self.engine_id:
            object.__setattr__(self, "engine_id", default_engine_id(self.shards))
        if self.database_url is not None and self.shard_map is not None:
            raise SettingsError(
                "DUETIME_DATABASE_URL",
                self.database_url,
                "it unset when DUETIME_SHARD_DSNS is set: name the databases one way, not both",
            )
        if self.run_queue == "nats" and self.nats_url is None:
            raise SettingsError("DUETIME_RUN_QUEUE", "nats", "DUETIME_NATS_URL to be set as well")
        if self.heartbeat_s > self.lease_s / 2:
            raise SettingsError(
                "DUETIME_HEARTBEAT_S",
                _number_text(self.heartbeat_s),
                f"at most half of DUETIME_LEASE_S ({_number_text(self.lease_s)}), so one late "
                "heartbeat does not lose the lease",
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Build and check the settings; raises ``SettingsError`` naming the first bad variable."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(f.metadata["env"])
            if raw is None or not raw.strip():
                continue
            values[f.name] = f.metadata["parse"](f.metadata["env"], raw)
        return cls(**values)

    @property
    def uses_embedded_pg(self) -> bool:
        """No database named: ``duetime run`` brings its own."""
        return self.database_url is None and self.shard_map is None

    def shard_dsns(self) -> list[str]:
        """The DSN of each logical shard, index = shard (16 entries)."""
        if self.shard_map is not None:
            return list(self.shard_map)
        if self.database_url is not None:
            return [self.database_url] * SHARDS
        raise SettingsError(
            "DUETIME_DATABASE_URL",
            None,
            "a PostgreSQL URL (or DUETIME_SHARD_DSNS); only `duetime run` starts an embedded database "
            "by itself",
        )

    def shard_set(self) -> frozenset[int]:
        """The logical shards this process's engine serves."""
        return self.shards

    def topics(self) -> TopicPolicy:
        """The topic rules of registration and publish, with this deployment's run queue prefix."""
        return TopicPolicy(
            rule=self.topic_policy,
            prefix=self.topic_prefix,
            allowlist=self.topic_allowlist,
            reserved_subjects=(self.nats_run_subject,),
        )

    def with_database(self, dsn: str) -> Settings:
        """The same settings on one given database (the embedded one), for the parts that read them."""
        return replace(self, database_url=dsn, shard_map=None)


def _number_text(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def unknown_variables(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Messages for ``DUETIME_*`` names no setting reads: usually a typo worth a warning."""
    known = [cast(str, f.metadata["env"]) for f in fields(Settings)]
    out: list[str] = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known or name.startswith(FOREIGN_PREFIXES):
            continue
        if name in CLIENT_VARIABLES:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        out.append(f"{name} is not a Duetime setting and is ignored{hint}")
    return out


def render_settings_table() -> str:
    """The Markdown table of every variable, its default and its meaning (docs/settings.md)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for f in fields(Settings):
        doc = cast(str, f.metadata["doc"]).replace("|", "\\|")
        shown = f.metadata["shown"] if f.metadata["shown"] is not None else str(f.default)
        lines.append(f"| `{f.metadata['env']}` | {shown} | {doc} |")
    return "\n".join(lines) + "\n"
