"""Settings from DUETIME_* variables: every default, every refusal, the shard map and the docs table."""

from __future__ import annotations

import dataclasses
import socket
from ipaddress import ip_network
from pathlib import Path

import pytest

from duetime.core.errors import DuetimeError
from duetime.settings import (
    Settings,
    SettingsError,
    format_shard_set,
    parse_shard_dsns,
    parse_shard_set,
    redact_dsn,
    render_settings_table,
    unknown_variables,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
A = "postgresql://a/db"
B = "postgresql://b/db"


def test_defaults_from_an_empty_environment() -> None:
    s = Settings.from_env({})
    assert s.database_url is None
    assert s.shard_map is None
    assert s.uses_embedded_pg
    assert (s.http_host, s.http_port) == ("127.0.0.1", 8080)
    assert s.nats_url is None and s.redis_url is None
    assert s.webhook_allow_private is False
    assert s.webhook_allow_cidrs == ()
    assert s.shard_set() == frozenset(range(16))
    assert s.engine_id == f"{socket.gethostname()}:0-15"
    assert (s.lookahead_s, s.claim_batch, s.poll_interval_s) == (60.0, 500, 1.0)
    assert (s.lease_s, s.heartbeat_s, s.janitor_interval_s) == (30.0, 10.0, 5.0)
    assert (s.run_queue, s.run_queue_max) == ("inprocess", 10000)
    assert (s.worker_concurrency, s.target_concurrency, s.target_rate) == (1024, 256, 10000.0)
    assert s.shutdown_grace_s == 30.0
    assert (s.misfire_run_all_cap, s.max_skipped_recorded) == (100, 100)
    assert s.db_pool_size == 10
    assert s.log_level == "INFO"
    assert s.data_dir == Path(".duetime")


def test_every_variable_is_read() -> None:
    env = {
        "DUETIME_DATABASE_URL": "postgresql://u:pw@db:5433/x",
        "DUETIME_HTTP_HOST": "0.0.0.0",
        "DUETIME_HTTP_PORT": "9000",
        "DUETIME_NATS_URL": "nats://127.0.0.1:4222",
        "DUETIME_REDIS_URL": "redis://127.0.0.1:6379/0",
        "DUETIME_WEBHOOK_ALLOW_PRIVATE": "true",
        "DUETIME_WEBHOOK_ALLOW_CIDRS": "10.20.0.0/16, fd12:3456::/48",
        "DUETIME_ENGINE_ID": "engine-a",
        "DUETIME_SHARDS": "0-3,8",
        "DUETIME_LOOKAHEAD_S": "30",
        "DUETIME_CLAIM_BATCH": "100",
        "DUETIME_POLL_INTERVAL_S": "0.5",
        "DUETIME_LEASE_S": "20",
        "DUETIME_HEARTBEAT_S": "5",
        "DUETIME_JANITOR_INTERVAL_S": "2.5",
        "DUETIME_RUN_QUEUE": "NATS",
        "DUETIME_RUN_QUEUE_MAX": "50",
        "DUETIME_WORKER_CONCURRENCY": "8",
        "DUETIME_TARGET_CONCURRENCY": "4",
        "DUETIME_TARGET_RATE": "2.5",
        "DUETIME_SHUTDOWN_GRACE_S": "0",
        "DUETIME_MISFIRE_RUN_ALL_CAP": "7",
        "DUETIME_MAX_SKIPPED_RECORDED": "0",
        "DUETIME_DB_POOL_SIZE": "3",
        "DUETIME_LOG_LEVEL": "debug",
        "DUETIME_DATA_DIR": "/var/tmp/dt",
    }
    s = Settings.from_env(env)
    assert s.shard_dsns() == ["postgresql://u:pw@db:5433/x"] * 16
    assert not s.uses_embedded_pg
    assert (s.http_host, s.http_port) == ("0.0.0.0", 9000)
    assert s.nats_url == "nats://127.0.0.1:4222"
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.webhook_allow_private is True
    assert s.webhook_allow_cidrs == (ip_network("10.20.0.0/16"), ip_network("fd12:3456::/48"))
    assert s.engine_id == "engine-a"
    assert s.shard_set() == frozenset({0, 1, 2, 3, 8})
    assert (s.lookahead_s, s.claim_batch, s.poll_interval_s) == (30.0, 100, 0.5)
    assert (s.lease_s, s.heartbeat_s, s.janitor_interval_s) == (20.0, 5.0, 2.5)
    assert (s.run_queue, s.run_queue_max) == ("nats", 50)
    assert (s.worker_concurrency, s.target_concurrency, s.target_rate) == (8, 4, 2.5)
    assert s.shutdown_grace_s == 0.0
    assert (s.misfire_run_all_cap, s.max_skipped_recorded, s.db_pool_size) == (7, 0, 3)
    assert s.log_level == "DEBUG"
    assert s.data_dir == Path("/var/tmp/dt")


def test_empty_values_mean_default() -> None:
    s = Settings.from_env({"DUETIME_HTTP_PORT": "", "DUETIME_DATABASE_URL": "  "})
    assert s.http_port == 8080
    assert s.database_url is None


def test_settings_are_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.http_port = 1  # type: ignore[misc]


def test_engine_id_default_follows_the_shard_set_and_is_stable() -> None:
    a = Settings.from_env({"DUETIME_SHARDS": "8-15"})
    b = Settings.from_env({"DUETIME_SHARDS": "15,8-14"})
    assert a.engine_id == b.engine_id == f"{socket.gethostname()}:8-15"
    assert Settings.from_env({"DUETIME_SHARDS": "0-7"}).engine_id != a.engine_id


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("DUETIME_DATABASE_URL", "mysql://x/db", "PostgreSQL URL"),
        ("DUETIME_HTTP_HOST", "local host", "host name or IP address"),
        ("DUETIME_HTTP_HOST", "http://x", "host name or IP address"),
        ("DUETIME_HTTP_PORT", "80x", "integer from 0 to 65535"),
        ("DUETIME_HTTP_PORT", "70000", "integer from 0 to 65535"),
        ("DUETIME_HTTP_PORT", "-1", "integer from 0 to 65535"),
        ("DUETIME_NATS_URL", "127.0.0.1:4222", "nats://"),
        ("DUETIME_REDIS_URL", "http://x", "redis://"),
        ("DUETIME_WEBHOOK_ALLOW_PRIVATE", "maybe", "boolean"),
        ("DUETIME_WEBHOOK_ALLOW_CIDRS", "10.0.0.1/8", "no host bits set"),
        ("DUETIME_WEBHOOK_ALLOW_CIDRS", "10.0.0.0/8,banana", "'banana' is not one"),
        ("DUETIME_ENGINE_ID", "two words", "without spaces"),
        ("DUETIME_ENGINE_ID", "x" * 201, "1 to 200"),
        ("DUETIME_SHARDS", "16", "from 0 to 15"),
        ("DUETIME_SHARDS", "7-0", "runs backwards"),
        ("DUETIME_SHARDS", "0-7,,9", "comma-separated"),
        ("DUETIME_SHARDS", "a-b", "is neither"),
        ("DUETIME_LOOKAHEAD_S", "0", "> 0"),
        ("DUETIME_LOOKAHEAD_S", "soon", "> 0"),
        ("DUETIME_LOOKAHEAD_S", "inf", "> 0"),
        ("DUETIME_CLAIM_BATCH", "0", "integer from 1 to 100000"),
        ("DUETIME_CLAIM_BATCH", "1.5", "integer from 1 to 100000"),
        ("DUETIME_POLL_INTERVAL_S", "-1", "> 0"),
        ("DUETIME_LEASE_S", "nan", "> 0"),
        ("DUETIME_HEARTBEAT_S", "0", "> 0"),
        ("DUETIME_JANITOR_INTERVAL_S", "5s", "> 0"),
        ("DUETIME_RUN_QUEUE", "kafka", "'inprocess'"),
        ("DUETIME_RUN_QUEUE_MAX", "0", "integer ≥ 1"),
        ("DUETIME_WORKER_CONCURRENCY", "many", "integer ≥ 1"),
        ("DUETIME_TARGET_CONCURRENCY", "0", "integer ≥ 1"),
        ("DUETIME_TARGET_RATE", "0", "number > 0"),
        ("DUETIME_SHUTDOWN_GRACE_S", "-5", "≥ 0"),
        ("DUETIME_MISFIRE_RUN_ALL_CAP", "0", "integer ≥ 1"),
        ("DUETIME_MAX_SKIPPED_RECORDED", "-1", "integer ≥ 0"),
        ("DUETIME_DB_POOL_SIZE", "0", "integer from 1 to 1000"),
        ("DUETIME_LOG_LEVEL", "LOUD", "DEBUG, INFO"),
    ],
)
def test_bad_values_name_the_variable_the_value_and_the_expectation(
    variable: str, value: str, expected: str
) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({variable: value})
    err = info.value
    assert isinstance(err, DuetimeError)
    assert err.code == "invalid_setting"
    assert err.variable == variable == err.field
    assert err.value == value
    assert expected in err.expected
    assert err.message.startswith(f"{variable}={value!r} is not valid: expected ")


def test_heartbeat_must_fit_twice_in_the_lease() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"DUETIME_LEASE_S": "10", "DUETIME_HEARTBEAT_S": "6"})
    assert info.value.variable == "DUETIME_HEARTBEAT_S"
    assert "half of DUETIME_LEASE_S (10)" in info.value.message
    assert Settings.from_env({"DUETIME_LEASE_S": "10", "DUETIME_HEARTBEAT_S": "5"}).heartbeat_s == 5.0


def test_nats_run_queue_needs_a_nats_url() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"DUETIME_RUN_QUEUE": "nats"})
    assert info.value.variable == "DUETIME_RUN_QUEUE"
    assert "DUETIME_NATS_URL" in info.value.message


def test_database_url_and_shard_dsns_are_exclusive() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(
            {"DUETIME_DATABASE_URL": "postgresql://u:secret@x/db", "DUETIME_SHARD_DSNS": f"0-15={A}"}
        )
    assert info.value.variable == "DUETIME_DATABASE_URL"
    assert "DUETIME_SHARD_DSNS" in info.value.message
    assert "secret" not in info.value.message


def test_shard_dsns_without_any_database_is_a_settings_error() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({}).shard_dsns()
    assert info.value.message.startswith("DUETIME_DATABASE_URL is not set: expected a PostgreSQL URL")


# --- the shard map ------------------------------------------------------------------------------


def test_shard_map_spreads_shards_over_databases() -> None:
    s = Settings.from_env({"DUETIME_SHARD_DSNS": f"0-7={A}, 8-15={B}"})
    assert s.shard_dsns() == [A] * 8 + [B] * 8
    assert not s.uses_embedded_pg


def test_shard_map_accepts_single_shards_any_order_and_multi_host_dsns() -> None:
    multi = "postgresql://h1:5432,h2:5433/db?target_session_attrs=read-write"
    dsns = parse_shard_dsns(f"15={A},0-7={multi},8-14={B}")
    assert dsns == (multi,) * 8 + (B,) * 7 + (A,)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"0-7={A}", "shards 8-15 are not mapped"),
        (f"0-7={A},9-15={B}", "shards 8 are not mapped"),
        (f"0-7={A},7-15={B}", "shard 7 is in both '0-7' and '7-15'"),
        (f"0-15={A},3={B}", "shard 3 is in both"),
        (f"0-16={A}", "goes past 15"),
        (f"8-0={A}", "runs backwards"),
        ("0-15=mysql://x/db", "PostgreSQL URL"),
        ("0-15=", "have no DSN"),
        (A, "has no '='"),
        (f"x={A}", "is neither"),
    ],
)
def test_shard_map_errors(text: str, expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"DUETIME_SHARD_DSNS": text})
    assert info.value.variable == "DUETIME_SHARD_DSNS"
    assert expected in info.value.message


def test_shard_map_error_hides_passwords() -> None:
    with pytest.raises(SettingsError) as info:
        parse_shard_dsns("0-7=postgresql://u:hunter2@a/db")
    assert "hunter2" not in info.value.message
    assert "postgresql://u:***@a/db" in info.value.message


def test_parse_and_format_shard_sets() -> None:
    assert parse_shard_set("0-7,9") == frozenset({*range(8), 9})
    assert parse_shard_set(" 3 ") == frozenset({3})
    assert parse_shard_set("0-3,2-5") == frozenset(range(6))
    assert format_shard_set(frozenset({0, 1, 2, 3, 9, 11, 12})) == "0-3,9,11-12"
    assert format_shard_set(set(range(16))) == "0-15"
    with pytest.raises(SettingsError) as info:
        parse_shard_set("", variable="--shards")
    assert info.value.variable == "--shards"


def test_with_database_points_every_shard_at_one_dsn() -> None:
    s = Settings.from_env({"DUETIME_SHARDS": "1-2"}).with_database(A)
    assert s.shard_dsns() == [A] * 16
    assert s.shard_set() == frozenset({1, 2})


def test_redact_dsn() -> None:
    assert redact_dsn("postgresql://u:p@h/db") == "postgresql://u:***@h/db"
    assert redact_dsn("postgresql://u@h/db") == "postgresql://u@h/db"
    assert (
        redact_dsn("postgresql://h/db?user=u&password=p&x=1") == "postgresql://h/db?user=u&password=***&x=1"
    )


def test_unknown_variables_suggest_the_near_miss() -> None:
    found = unknown_variables({"DUETIME_HTTP_PRT": "1", "DUETIME_TEST_PG": "x", "PATH": "/bin"})
    assert found == [
        "DUETIME_HTTP_PRT is not a Duetime setting and is ignored (did you mean DUETIME_HTTP_PORT?)"
    ]
    assert unknown_variables({"DUETIME_HTTP_PORT": "1"}) == []


# --- the docs -----------------------------------------------------------------------------------


def test_docs_list_every_setting_with_its_current_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert render_settings_table() in text, "docs/settings.md is stale: paste render_settings_table()"
    for f in dataclasses.fields(Settings):
        assert f"`{f.metadata['env']}`" in text


def test_table_shows_every_field_once() -> None:
    rows = [line for line in render_settings_table().splitlines() if line.startswith("| `DUETIME_")]
    names = [row.split("`")[1] for row in rows]
    assert names == [f.metadata["env"] for f in dataclasses.fields(Settings)]
    assert len(set(names)) == len(names)


def test_the_clients_variables_are_not_reported_as_unknown() -> None:
    """DUETIME_URL and DUETIME_API_KEY are read by `duetime jobs` and the client, not by Settings;
    a shell exporting them for the CLI must not make every server process warn."""
    assert unknown_variables({"DUETIME_URL": "http://x", "DUETIME_API_KEY": "dt_x"}) == []
