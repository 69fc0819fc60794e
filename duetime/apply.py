"""``duetime jobs apply FILE``: make the owner's named jobs match a file, as a deploy script would.

The file (JSON, or YAML when it ends in .yaml/.yml) is a list of job specs, each with a unique
``name``. Each one is PUT to ``/v1/jobs/by-name/{name}``, which creates it, updates it, or (when
nothing differs) writes nothing; running the same file twice changes nothing the second time.
With ``--prune`` the owner's named jobs (not cancelled) that the file does not name are
cancelled. ``--dry-run`` asks the server what is there and prints the plan without writing.

The plan of a dry run compares the file with what the API shows: a webhook's header values are
secret (shown redacted), so a change of a header's value alone is not seen there; the real run
sends them and the server decides.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from duetime.client import DuetimeClient, Job, NotFoundError

# What the API fills in for fields a spec leaves out (api-v1.md), to compare a file with a job.
_DEFAULTS: dict[str, Any] = {
    "name": None,
    "labels": {},
    "payload": None,
    "retry": {
        "max_attempts": 5,
        "backoff_initial_s": 1.0,
        "backoff_max_s": 600.0,
        "backoff_multiplier": 2.0,
        "max_duration_s": None,
    },
    "misfire": "run_once",
    "misfire_grace_s": 60,
    "jitter_s": 0,
    "spread_s": 0,
    "overlap": "allow",
    "pause_after_failures": None,
}
_TARGET_DEFAULTS: dict[str, dict[str, Any]] = {
    "webhook": {"method": "POST", "headers": {}, "timeout_s": 30},
    "queue": {},
}
_CRON_DEFAULTS: dict[str, Any] = {
    "timezone": "UTC",
    "start_at": None,
    "end_at": None,
    "dst_gap": "shift",
    "dst_overlap": "first",
    "exclude": [],
}
# An ``every`` schedule without ``start_at`` keeps the stored one on a PUT (the server's default
# would be the time of the call), so a file that leaves it out does not differ by it.
_EVERY_DEFAULTS: dict[str, Any] = {"timezone": "UTC", "end_at": None, "exclude": []}


class ApplyError(Exception):
    """The file cannot be applied as it is (the message says why); nothing was sent."""


@dataclass(frozen=True, slots=True)
class Step:
    action: str  # create, update, unchanged, cancel
    name: str
    job_id: str | None = None
    fields: tuple[str, ...] = ()
    spec: dict[str, Any] = field(default_factory=dict, compare=False)
    updated_at: datetime | None = None  # the job's, when the plan read it


def load_specs(path: str, text: str) -> list[dict[str, Any]]:
    """The file's job specs, checked for what the server cannot check across jobs."""
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise ApplyError("reading YAML needs PyYAML: pip install 'duetime[yaml]'") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ApplyError(f"{path} is not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ApplyError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("jobs"), list):
        data = data["jobs"]
    if not isinstance(data, list):
        raise ApplyError(f"{path} must hold a list of job specs (or an object with a 'jobs' list)")
    seen: set[str] = set()
    specs: list[dict[str, Any]] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ApplyError(f"item {i} of {path} is not an object (a job spec)")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ApplyError(f"item {i} of {path} has no name; apply addresses jobs by name")
        if name in seen:
            raise ApplyError(f"{path} names {name!r} twice; names are unique per owner")
        seen.add(name)
        specs.append(_plain(item))
    return specs


def _plain(value: Any) -> Any:
    """YAML reads unquoted timestamps as datetimes; the API wants RFC 3339 strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


def _same_time(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return datetime.fromisoformat(str(a).replace("Z", "+00:00")) == datetime.fromisoformat(
            str(b).replace("Z", "+00:00")
        )
    except ValueError:
        return bool(a == b)


def _target_differs(wanted: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    full = {**_TARGET_DEFAULTS.get(str(wanted.get("type")), {}), **wanted}
    for key in set(full) | set(have):
        if key == "headers":
            # Values are shown redacted: only the names can be compared here.
            names = {k.lower() for k in (full.get("headers") or {})}
            if names != {k.lower() for k in (have.get("headers") or {})}:
                return True
        elif full.get(key) != have.get(key):
            return True
    return False


def _on_failure_differs(wanted: Mapping[str, Any] | None, have: Mapping[str, Any] | None) -> bool:
    if not wanted or not have:
        return bool(wanted) != bool(have)
    if int(wanted.get("after", 1)) != have.get("after"):
        return True
    return _target_differs(wanted.get("target") or {}, have.get("target") or {})


def _schedule_differs(wanted: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    if "run_at" in wanted:
        return "run_at" not in have or not _same_time(wanted["run_at"], have["run_at"])
    if "every" in wanted:
        full = {**_EVERY_DEFAULTS, **wanted}
        keys = set(full) | (set(have) - ({"start_at"} - set(wanted)))
    else:
        full = {**_CRON_DEFAULTS, **wanted}
        keys = set(full) | set(have)
    for key in keys:
        if key in ("start_at", "end_at"):
            if not _same_time(full.get(key), have.get(key)):
                return True
        elif full.get(key) != have.get(key):
            return True
    return False


def _numbers(retry: Mapping[str, Any]) -> dict[str, float | None]:
    """A retry policy with its numbers compared as numbers (``1`` is ``1.0``; None is unset)."""
    return {k: None if v is None else float(v) for k, v in retry.items()}


def changed_fields(spec: Mapping[str, Any], job: Job) -> tuple[str, ...]:
    """The fields a PUT of ``spec`` would change on ``job`` (as far as the API shows them)."""
    have = job.raw
    out = []
    for key, default in _DEFAULTS.items():
        wanted = spec.get(key, default)
        if key == "retry":
            wanted = {**default, **(spec.get("retry") or {})}
            if _numbers(wanted) != _numbers(have["retry"]):
                out.append(key)
        elif wanted != have.get(key):
            out.append(key)
    if _target_differs(spec.get("target") or {}, have["target"]):
        out.append("target")
    if _on_failure_differs(spec.get("on_failure"), have.get("on_failure")):
        out.append("on_failure")
    if _schedule_differs(spec.get("schedule") or {}, have["schedule"]):
        out.append("schedule")
    return tuple(sorted(out))


def plan(client: DuetimeClient, specs: list[dict[str, Any]], *, prune: bool) -> list[Step]:
    """What applying ``specs`` would do, read from the server without writing."""
    steps: list[Step] = []
    for spec in specs:
        name = spec["name"]
        try:
            job = client.get_job_by_name(name)
        except NotFoundError:
            steps.append(Step("create", name, spec=spec))
            continue
        fields = changed_fields(spec, job)
        steps.append(Step("update" if fields else "unchanged", name, job.id, fields, spec, job.updated_at))
    if prune:
        wanted = {spec["name"] for spec in specs}
        for job in client.iter_jobs(page_size=1000):
            if job.name is not None and job.state != "cancelled" and job.name not in wanted:
                steps.append(Step("cancel", job.name, job.id))
    return steps


def apply(
    client: DuetimeClient, steps: list[Step], *, say: Callable[[str], None], reason: str | None = None
) -> dict[str, int]:
    """Carry the plan out, one call per job, saying what each call did; counts by what happened.

    Every named job is PUT (not only those the plan thinks changed): the server is the judge, and
    a PUT that changes nothing writes nothing. Each call carries ``reason``, which the change
    history of every job it changes keeps."""
    done = {"created": 0, "updated": 0, "unchanged": 0, "cancelled": 0}
    for step in steps:
        if step.action == "cancel":
            assert step.job_id is not None
            client.cancel_job(step.job_id, reason=reason)
            done["cancelled"] += 1
            say(f"cancelled  {step.name}  {step.job_id}")
            continue
        job = client.put_job_by_name(step.name, step.spec, reason=reason)
        if step.action == "create":
            what = "created"
        elif job.updated_at == step.updated_at:
            what = "unchanged"  # the server wrote nothing
        else:
            what = "updated"
        done[what] += 1
        say(f"{what:<9}  {step.name}  {job.id}")
    return done


def describe(step: Step) -> str:
    """One line of a dry run's plan."""
    detail = f" ({', '.join(step.fields)})" if step.fields else ""
    where = f"  {step.job_id}" if step.job_id else ""
    return f"would {step.action:<9}  {step.name}{where}{detail}"


def read_file(path: str, stdin: Callable[[], str]) -> list[dict[str, Any]]:
    if path == "-":
        text = stdin()
        try:
            return load_specs("stdin.json", text)
        except ApplyError:
            return load_specs("stdin.yaml", text)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ApplyError(f"cannot read {path}: {exc.strerror or exc}") from None
    return load_specs(path, text)
