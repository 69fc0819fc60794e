"""``duetime jobs -o table``: the API's answers as rows and columns a person reads."""

from __future__ import annotations

from duetime.cli import build_parser, render_table

JOB = {
    "id": "0193a9c0-0000-7000-8000-000000000001",
    "name": "nightly",
    "state": "scheduled",
    "next_run_at": "2026-12-02T02:00:00Z",
    "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
    "target": {"type": "webhook", "url": "https://example.com/hook"},
    "payload": {"a": 1},
}


def test_a_page_of_jobs_is_one_row_each_with_the_columns_a_person_scans() -> None:
    text = render_table({"items": [JOB, {**JOB, "name": "hourly", "state": "paused"}], "next_cursor": "abc"})
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "NEXT_RUN_AT", "SCHEDULE", "TARGET"]
    assert "nightly" in lines[1] and "scheduled" in lines[1] and "0 3 * * * (Europe/Berlin)" in lines[1]
    assert "https://example.com/hook" in lines[1]
    assert "hourly" in lines[2] and "paused" in lines[2]
    assert lines[-1] == "(more: --cursor abc)"
    assert "payload" not in text.lower()  # nested detail stays in -o json


def test_runs_and_a_single_job_and_an_empty_page() -> None:
    run = {"job_id": "j1", "scheduled_for": "t", "attempt": 2, "outcome": "failed", "status_code": 500}
    runs = render_table({"items": [run], "next_cursor": None}).splitlines()
    assert runs[0].split()[:5] == ["JOB_ID", "SCHEDULED_FOR", "ATTEMPT", "OUTCOME", "STATUS_CODE"]
    assert runs[1].split()[:5] == ["j1", "t", "2", "failed", "500"]
    one = render_table(JOB).splitlines()
    assert one[0].split() == ["FIELD", "VALUE"]
    assert any(line.split()[:2] == ["state", "scheduled"] for line in one)
    assert render_table({"items": [], "next_cursor": None}) == "(none)"


def test_long_cells_are_cut_and_the_flag_is_accepted_before_and_after_the_action() -> None:
    text = render_table({"items": [{**JOB, "name": "x" * 200}]})
    assert "x" * 47 + "…" in text and "x" * 49 not in text
    parser = build_parser()
    assert parser.parse_args(["jobs", "-o", "table", "list"]).output == "table"
    assert parser.parse_args(["jobs", "list", "-o", "table"]).output == "table"
    assert parser.parse_args(["jobs", "list"]).output == "json"
