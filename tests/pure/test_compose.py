"""docker-compose.yml and deploy/ cannot be run here (no Docker engine), so they are checked against
the code they configure: every Duetime service's command parses with the real command line, its
environment builds real Settings, its published and scraped ports are its DUETIME_HTTP_PORT, its
DSNs and URLs name services of the file, and the dashboard only queries metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import REGISTRY

import duetime.api.metrics
import duetime.exposition
import duetime.runqueue.metrics
import duetime.runqueue.natsqueue
from duetime.cli import COMMANDS, build_parser
from duetime.settings import Settings, unknown_variables

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DUETIME = {name: svc for name, svc in SERVICES.items() if svc.get("image") == "duetime:local"}


def _env(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment", {})
    assert isinstance(env, dict), "environment as a mapping, so anchors can merge"
    return {k: str(v) for k, v in env.items()}


def test_the_cluster_has_every_role_twice_three_engines_and_its_infrastructure() -> None:
    roles = [svc["command"][0] for svc in DUETIME.values()]
    assert roles.count("api") == 2 and roles.count("engine") == 3 and roles.count("worker") == 2
    assert roles.count("migrate") == 1
    images = {svc.get("image", "").split(":")[0] for svc in SERVICES.values()}
    assert {"postgres", "nats", "redis", "prom/prometheus", "grafana/grafana"} <= images
    assert sum(1 for svc in SERVICES.values() if svc.get("image") == "postgres:15") == 2


@pytest.mark.parametrize("name", sorted(DUETIME))
def test_every_command_is_one_the_cli_knows(name: str) -> None:
    command = DUETIME[name]["command"]
    assert command[0] in COMMANDS
    args = build_parser().parse_args(command)  # exits (SystemExit) on anything it does not know
    assert args.command == command[0]


@pytest.mark.parametrize("name", sorted(DUETIME))
def test_every_variable_is_a_real_setting_with_a_valid_value(name: str) -> None:
    env = _env(DUETIME[name])
    assert all(k.startswith("DUETIME_") for k in env)
    assert unknown_variables(env) == []
    settings = Settings.from_env(env)  # raises on a bad value
    assert settings.run_queue == "nats"


def test_the_engines_join_the_dealing_unrestricted_with_two_replicas() -> None:
    """No hand-written shard map: every engine may serve every shard, and a dead one's shards are
    dealt to the others (with R = 2 and three engines, each shard on two of them)."""
    for svc in DUETIME.values():
        args = build_parser().parse_args(svc["command"])
        if args.command == "engine":
            assert args.shards is None, "engines without --shards join the dealing"
            settings = Settings.from_env(_env(svc))
            assert settings.shards == frozenset(range(16))
            assert settings.shard_replicas == 2


def test_engine_ids_are_distinct() -> None:
    ids = [_env(svc).get("DUETIME_ENGINE_ID") for svc in DUETIME.values() if svc["command"][0] == "engine"]
    assert len(set(ids)) == len(ids) == 3 and None not in ids


def test_dsns_and_broker_urls_name_services_of_this_file() -> None:
    for name, svc in DUETIME.items():
        settings = Settings.from_env(_env(svc))
        hosts = {urlsplit(dsn).hostname for dsn in settings.shard_dsns()}
        assert hosts == {"pg-a", "pg-b"}, name
        assert hosts <= SERVICES.keys()
        for url in (settings.nats_url, settings.redis_url):
            assert url is not None and urlsplit(url).hostname in SERVICES, (name, url)
    pg_user = SERVICES["pg-a"]["environment"]["POSTGRES_USER"]
    dsn = Settings.from_env(_env(DUETIME["api-1"])).shard_dsns()[0]
    assert urlsplit(dsn).username == pg_user


def _published(svc: dict[str, Any]) -> list[tuple[int, int]]:
    out = []
    for spec in svc.get("ports", []):
        host, _, container = str(spec).rpartition(":")
        out.append((int(host), int(container)))
    return out


def test_published_ports_are_the_http_ports_and_do_not_clash() -> None:
    host_ports: list[int] = []
    for svc in SERVICES.values():
        host_ports.extend(h for h, _ in _published(svc))
    assert len(host_ports) == len(set(host_ports))
    for name, svc in DUETIME.items():
        port = Settings.from_env(_env(svc)).http_port
        for _, container in _published(svc):
            assert container == port, name
        if svc["command"][0] == "api":
            assert _published(svc), f"{name}: an API others can reach"


def test_prometheus_scrapes_every_duetime_process_on_its_port() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text(encoding="utf-8"))
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    expected = {
        f"{name}:{Settings.from_env(_env(svc)).http_port}"
        for name, svc in DUETIME.items()
        if svc["command"][0] != "migrate"
    }
    assert targets == expected
    mounted = " ".join(SERVICES["prometheus"]["volumes"])
    assert "./deploy/prometheus.yml:" in mounted


def test_the_alert_rules_are_loaded_and_watch_the_dealing_with_real_metrics() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text(encoding="utf-8"))
    (pattern,) = config["rule_files"]
    mounts = dict(v.split(":")[:2] for v in SERVICES["prometheus"]["volumes"])
    host_dir = next(h for h, c in mounts.items() if pattern.startswith(c + "/"))
    files = sorted((ROOT / host_dir).glob(pattern.rpartition("/")[2]))
    assert files, f"no rule file matches {pattern} in {host_dir}"
    rules = [
        r for f in files for g in yaml.safe_load(f.read_text(encoding="utf-8"))["groups"] for r in g["rules"]
    ]
    by_name = {r["alert"]: r["expr"] for r in rules}
    assert (
        "duetime_shard_engines" in by_name["DuetimeShardUnserved"]
        and "== 0" in by_name["DuetimeShardUnserved"]
    )
    assert "duetime_shard_replicas" in by_name["DuetimeShardUnderReplicated"]
    used = {m for e in by_name.values() for m in re.findall(r"\bduetime_[a-z_]+", e)}
    assert used <= _metric_names(), f"unknown metrics: {sorted(used - _metric_names())}"


def _metric_names() -> set[str]:
    assert (
        duetime.runqueue.metrics and duetime.api.metrics and duetime.runqueue.natsqueue and duetime.exposition
    )  # imported for their registrations (duetime_build_info is duetime.exposition's)
    names: set[str] = set()
    for family in REGISTRY.collect():
        base = family.name
        if family.type == "counter":
            names.add(base + "_total")
        elif family.type == "histogram":
            names.update({base + "_bucket", base + "_sum", base + "_count"})
        else:
            names.add(base)
    return names


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/duetime.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bduetime_[a-z_]+", e)}
    known = _metric_names()
    assert used, "the dashboard queries Duetime metrics"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"
    # The four things the dashboard is for.
    assert {"duetime_fire_lateness_seconds_bucket", "duetime_nats_pending_runs"} <= used
    assert "duetime_completions_total" in used and "duetime_api_requests_total" in used
    assert "duetime_shard_engines" in used, "the dealing: engines per shard"
    provisioned = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/duetime.yml").read_text(encoding="utf-8")
    )
    path = provisioned["providers"][0]["options"]["path"]
    assert any(v.endswith(":" + path + ":ro") for v in SERVICES["grafana"]["volumes"])
