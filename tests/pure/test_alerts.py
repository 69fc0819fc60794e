"""deploy/prometheus/*.rules.yml: loaded by deploy/prometheus.yml, well-formed, one rule for each row
of the alert table in docs/operations.md, and naming only metrics that Duetime exports.

No Prometheus runs here, so the rules are checked statically: the shape Prometheus requires of a
rule file, balanced expressions, and every ``duetime_*`` series name against the registry."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

import duetime.engine.due_age
import duetime.exposition
import duetime.storage.dbclock
import duetime.supervisor
from tests.pure.test_compose import _metric_names

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "deploy" / "prometheus").glob("*.rules.yml"))
RULES: dict[str, Any] = {
    "groups": [
        group for path in RULE_FILES for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    ]
}
_DURATION = re.compile(r"^\d+[smhd]$")


def _rules() -> list[dict[str, Any]]:
    return [rule for group in RULES["groups"] for rule in group["rules"]]


def test_prometheus_loads_every_rules_file_that_compose_mounts() -> None:
    import fnmatch

    assert {p.name for p in RULE_FILES} >= {"alerts.rules.yml", "duetime.rules.yml"}
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text(encoding="utf-8"))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    mounts = {
        container: host
        for host, container, *_ in (v.split(":") for v in compose["services"]["prometheus"]["volumes"])
    }
    for pattern in config["rule_files"]:
        folder, _, glob = pattern.rpartition("/")
        assert mounts[folder] == "./deploy/prometheus", mounts
        assert [p.name for p in RULE_FILES] == sorted(
            p.name for p in (ROOT / "deploy" / "prometheus").iterdir() if fnmatch.fnmatch(p.name, glob)
        )
    for path in RULE_FILES:
        assert set(yaml.safe_load(path.read_text(encoding="utf-8"))) == {"groups"}, path


def test_the_file_has_the_shape_prometheus_requires() -> None:
    assert set(RULES) == {"groups"}
    names = [g["name"] for g in RULES["groups"]]
    assert len(names) == len(set(names)), "group names are unique"
    alerts = [r["alert"] for r in _rules()]
    assert len(alerts) == len(set(alerts)), "alert names are unique"
    for rule in _rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", rule["alert"])
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        if "for" in rule:
            assert _DURATION.match(rule["for"]), rule
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"], rule  # what it means; a description says what to do
        expr = rule["expr"]
        for open_, close in ("()", "[]", "{}"):
            assert expr.count(open_) == expr.count(close), (rule["alert"], expr)


def test_every_metric_a_rule_names_exists() -> None:
    # imported for their registrations
    assert duetime.engine.due_age and duetime.exposition and duetime.storage.dbclock and duetime.supervisor
    known = _metric_names()
    for rule in _rules():
        # label values in quotes are not metric names
        expr = re.sub(r'"[^"]*"', '""', rule["expr"])
        used = set(re.findall(r"\bduetime_[a-z_]+\b", expr))
        assert used <= known, (rule["alert"], sorted(used - known))


def test_every_row_of_the_operations_table_is_a_rule() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    table = text.split("## What to alert on", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `Duetime")]
    documented = {re.match(r"\| `(\w+)`", row).group(1) for row in rows}  # type: ignore[union-attr]
    assert documented == {r["alert"] for r in _rules()}
    # and the table shows each rule's own expression, so the two cannot drift apart
    for row in rows:
        name = re.match(r"\| `(\w+)`", row).group(1)  # type: ignore[union-attr]
        rule = next(r for r in _rules() if r["alert"] == name)
        assert " ".join(rule["expr"].split()) in row.replace("\\|", "|"), name


def test_the_dashboard_takes_its_datasource_from_a_variable() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/duetime.json").read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    def sources(node: Any) -> list[Any]:
        if isinstance(node, dict):
            found = [node["datasource"]] if "datasource" in node else []
            return found + [s for v in node.values() for s in sources(v)]
        if isinstance(node, list):
            return [s for v in node for s in sources(v)]
        return []

    used = sources(dashboard["panels"])
    assert used and all(s == {"type": "prometheus", "uid": "${datasource}"} for s in used)


def test_dashboard_panels_have_unique_ids() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/duetime.json").read_text(encoding="utf-8"))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
