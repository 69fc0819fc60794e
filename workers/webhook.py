"""Webhook targets: one HTTP request per attempt, exactly as docs/targets.md describes it.

Two things here are about safety rather than HTTP:

* SSRF is checked again at call time, and the connection goes to the address that was checked.
  ``CheckedResolver`` is the only resolver the client (``workers/http1.py``) has, and every new
  connection asks it, for a name or an address alike: a name that resolved to a public address at
  check time cannot be re-pointed (DNS rebinding) at a private one for the connect. The URL keeps
  its host name, so the Host header, TLS SNI and certificate verification all still use the name.
* The client is shared by every owner's targets, so it keeps no cookies, reads no proxy settings
  from the environment and never follows a redirect (a 3xx could point anywhere).

Nothing in this module retries: a failure is classified (retryable or not) and handed back to the
scheduler, the one layer that retries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import re
import socket
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import cast

from yarl import URL

from duetime.core import signing, ssrf
from duetime.core.errors import InvalidRequest, TargetNotAllowed
from duetime.core.headers import is_reserved_header
from duetime.core.model import Outcome, WebhookTarget
from duetime.core.retry import retry_after_s
from duetime.core.runpath import Delivery, RunContext, Verdict
from duetime.workers import http1
from duetime.workers.http1 import ResolveResult
from duetime.workers.tracing import TRACEPARENT

MAX_RESPONSE_READ = http1.MAX_BODY_READ
USER_AGENT = "Duetime-Webhook/1"
# The client's own headers: a job cannot set these names (core.headers), so they are always sent.
_DEFAULT_HEAD = f"User-Agent: {USER_AGENT}\r\nAccept: */*\r\n"
# What an answer that is not HTTP was called when aiohttp parsed answers (its exception's name);
# kept word for word so that run histories and alerts read the same across the change of client.
INVALID_ANSWER = "invalid answer (ClientResponseError)"


# RFC 9110 field-name token, and a value with no control characters but tab.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def classify_status(status: int) -> Verdict:
    """The contract's table: 2xx succeeds; 408, 429, 5xx are retried; anything else is final.

    A verdict is a frozen record and a function of the status alone, so each status's one is
    made once and shared (a burst of 2xx answers builds no record for them)."""
    verdict = _STATUS_VERDICTS.get(status)
    if verdict is None:
        verdict = _STATUS_VERDICTS[status] = _status_verdict(status)
    return verdict


def _status_verdict(status: int) -> Verdict:
    if 200 <= status < 300:
        return Verdict(Outcome.SUCCEEDED, False, status, None)
    if 300 <= status < 400:
        return Verdict(Outcome.FAILED, False, status, f"redirect refused (HTTP {status})")
    if status in (408, 429) or status >= 500:
        return Verdict(Outcome.FAILED, True, status, f"HTTP {status}")
    return Verdict(Outcome.FAILED, False, status, f"HTTP {status}")


# status -> its verdict; bounded by what the parser accepts as a status (three digits).
_STATUS_VERDICTS: dict[int, Verdict] = {}


def contract_headers(d: Delivery, body: bytes, now: datetime) -> dict[str, str]:
    """Every header the contract promises a webhook target, signature included."""
    key = signing.delivery_key(d.job_id, d.scheduled_for, d.event)
    timestamp = int(now.timestamp())
    headers = {
        signing.IDEMPOTENCY_KEY: key,
        signing.JOB_ID: d.job_id,
        signing.SCHEDULED_FOR: signing.format_occurrence(d.scheduled_for),
        signing.ATTEMPT: str(d.attempt),
        signing.FENCING_TOKEN: str(d.fencing_token),
        **({} if d.context is None else dict(d.context.headers())),
        signing.WEBHOOK_ID: key,
        signing.WEBHOOK_TIMESTAMP: str(timestamp),
        # During a secret rotation's grace, one signature per secret, space-separated.
        signing.WEBHOOK_SIGNATURE: " ".join(
            signing.sign(secret, key, timestamp, body)
            for secret in (d.signing_secret, *d.extra_signing_secrets)
        ),
    }
    if d.event is not None:
        headers[signing.EVENT] = d.event
    return headers


def contract_head(d: Delivery, body: bytes, now: datetime) -> str:
    """``contract_headers`` as the request carries them (each ``name: value`` and CRLF, in the
    same order), then ``traceparent`` when the attempt has one and ``Content-Length``, the last
    line before the blank one: what follows a target's remembered head (``PreparedTarget``) in
    every request. One string per call instead of a dict that is then written out;
    ``tests/pure/test_webhook_request.py`` holds the two forms to the same bytes."""
    key = signing.delivery_key(d.job_id, d.scheduled_for, d.event)
    timestamp = int(now.timestamp())
    signature = signing.sign(d.signing_secret, key, timestamp, body)
    if d.extra_signing_secrets:
        # During a secret rotation's grace, one signature per secret, space-separated.
        signature = " ".join(
            [signature, *(signing.sign(secret, key, timestamp, body) for secret in d.extra_signing_secrets)]
        )
    event = "" if d.event is None else f"{signing.EVENT}: {d.event}\r\n"
    trace = "" if d.traceparent is None else f"{TRACEPARENT}: {d.traceparent}\r\n"
    context = "" if d.context is None else _context_lines(d.context)
    return (
        f"{signing.IDEMPOTENCY_KEY}: {key}\r\n"
        f"{signing.JOB_ID}: {d.job_id}\r\n"
        f"{signing.SCHEDULED_FOR}: {signing.format_occurrence(d.scheduled_for)}\r\n"
        f"{signing.ATTEMPT}: {d.attempt}\r\n"
        f"{signing.FENCING_TOKEN}: {d.fencing_token}\r\n"
        f"{context}"
        f"{signing.WEBHOOK_ID}: {key}\r\n"
        f"{signing.WEBHOOK_TIMESTAMP}: {timestamp}\r\n"
        f"{signing.WEBHOOK_SIGNATURE}: {signature}\r\n"
        f"{event}{trace}Content-Length: {len(body)}\r\n\r\n"
    )


def _context_lines(context: RunContext) -> str:
    """A run's context as header lines (``RunContext.headers``). Most runs carry the spec version
    alone (a one-off that has not succeeded yet: a burst): that line is made once per version."""
    if context.previous_for is None and context.last_success_for is None and context.folded_from is None:
        return _version_line(context.spec_version)
    return "".join([f"{name}: {value}\r\n" for name, value in context.headers()])


@functools.lru_cache(maxsize=1024)
def _version_line(spec_version: int) -> str:
    return f"{signing.SPEC_VERSION}: {spec_version}\r\n"


def request_headers(target: WebhookTarget, contract: dict[str, str]) -> dict[str, str]:
    """The job's headers first, then ours; a job header that names one of ours is dropped."""
    headers = _fixed_headers(target.headers)
    headers.update(contract)
    return headers


def _fixed_headers(job_headers: Mapping[str, str]) -> dict[str, str]:
    """The headers that are the same on every call of a target: the job's own (a name that is
    reserved dropped), then ``Content-Type``."""
    headers = {k: v for k, v in job_headers.items() if not is_reserved_header(k)}
    headers["Content-Type"] = "application/json"
    return headers


def invalid_header(headers: dict[str, str]) -> str | None:
    """The name of the first job header HTTP cannot carry, or None.

    Registration is meant to refuse these; checking again here turns a bad stored header into a
    final, explained failure instead of an exception from the HTTP client.
    """
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name) or _BAD_VALUE.search(value):
            return name
    return None


# URLs whose parse and guard verdict are remembered (per policy). A burst calls a few URLs many
# times; a million different URLs only cost the cache's churn (least recently used go first).
URL_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=URL_CACHE_SIZE)
def limiter_key(url: str) -> str:
    """``host:port`` of a webhook URL: the unit the per-host limits are counted in.

    Remembered per URL (it is a function of the text alone); a URL that does not parse raises
    ``ValueError`` every time, as exceptions are not cached."""
    parsed = URL(url)
    host = (parsed.host or "").lower()
    return f"{host}:{parsed.port}"


@dataclasses.dataclass(frozen=True, slots=True)
class JudgedUrl:
    """What a webhook URL's text decides under one policy, before any DNS: its parse, its host,
    and either a final refusal or leave to call.

    ``resolve_literal`` marks a host that looks like an address literal (``_looks_like_address``)
    but that the guard's parser does not read as one: such a host goes through
    ``ssrf.resolve_checked`` at every call, as before, instead of being remembered. (The client
    resolves every new connection's host through the checked resolver as well.)
    """

    url: URL | None
    host: str
    refusal: Verdict | None
    resolve_literal: bool = False


@functools.lru_cache(maxsize=URL_CACHE_SIZE)
def judge_url(raw: str, policy: ssrf.AddressPolicy) -> JudgedUrl:
    """The guard's verdict on a URL's text: ``check_url`` and, for an address literal, the
    address check ``resolve_checked`` makes without DNS.

    Both are pure functions of the text and the policy (tests/pure/test_ssrf.py), so the verdict
    is remembered per (URL, policy) instead of being re-read before every call: the verdict each
    call obeys is the one the guard gives for that URL under that policy, exactly as before. What
    can change between calls, a name's DNS answers, is not remembered here: ``CheckedResolver``
    resolves and checks a name for every new connection, as before.
    """
    host = ""
    try:
        url = URL(raw)
        host = url.host or ""
        ssrf.check_url(raw, policy)
        # aiohttp skipped the resolver for whatever it took for an address literal, so such a
        # host was checked here; kept with the same test, so the verdicts stay what they were.
        if _looks_like_address(host) and ssrf.judge_literal(host, policy) is None:
            return JudgedUrl(url, host, None, resolve_literal=True)
    except TargetNotAllowed as exc:
        refused = Verdict(Outcome.FAILED, False, None, f"target_not_allowed: {exc.message}")
        return JudgedUrl(None, host, refused)
    except (InvalidRequest, ValueError):
        return JudgedUrl(None, host, Verdict(Outcome.FAILED, False, None, "invalid webhook URL"))
    return JudgedUrl(url, host, None)


def _looks_like_address(host: str) -> bool:
    """aiohttp's test for an address literal (``helpers.is_ip_address``): all digits and dots,
    or any colon."""
    return bool(host) and (":" in host or host.replace(".", "").isdigit())


@functools.lru_cache(maxsize=URL_CACHE_SIZE)
def endpoint_of(url: URL) -> http1.Endpoint:
    """Where a (judged) URL's requests go and how they are written, as aiohttp wrote them: the
    IDNA-encoded host (a run of trailing dots folded to one) for DNS and TLS, the ``Host`` header
    with the port when it is not the scheme's default, and the path and query as yarl encodes
    them (a fragment is never sent)."""
    host = url.raw_host or ""
    if host.endswith(".."):
        host = host.rstrip(".") + "."
    return http1.Endpoint(
        tls=url.scheme == "https",
        host=host,
        port=url.port or 0,
        authority=url.host_port_subcomponent or host,
        target=url.raw_path_qs,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedTarget:
    """What a webhook target's URL, method and headers decide for every call, worked out once:
    the URL's judgement, the verdict on the job's headers, where requests go, and the request's
    head up to the contract's headers (request line, ``Host``, the client's headers, the job's
    headers without the reserved ones, ``Content-Type``) as the bytes sent.

    A burst calls the same few targets many times, and every run's spec is parsed into a target
    of its own, so this is remembered by value (``prepare``), never by object: a job whose
    headers or URL change gets a new entry for its new values at its next call.
    """

    judged: JudgedUrl
    bad_header: Verdict | None
    endpoint: http1.Endpoint | None
    head: bytes
    # The job's headers hold one spelled exactly ``traceparent``: a traced call then replaces
    # its value in place, as the header dict did, and is written the long way (``request_bytes``).
    job_traceparent: bool


def prepare(target: WebhookTarget, policy: ssrf.AddressPolicy) -> PreparedTarget:
    """``target``'s ``PreparedTarget`` under ``policy``, remembered by value (URL text, method,
    the job's headers in order, policy)."""
    return _prepare(target.url, target.method.value, tuple(target.headers.items()), policy)


@functools.lru_cache(maxsize=URL_CACHE_SIZE)
def _prepare(
    url: str, method: str, job_headers: tuple[tuple[str, str], ...], policy: ssrf.AddressPolicy
) -> PreparedTarget:
    judged = judge_url(url, policy)
    headers = dict(job_headers)
    bad = invalid_header(headers)
    bad_header = (
        None
        if bad is None
        else Verdict(Outcome.FAILED, False, None, f"job header {bad[:100]!r} is not a valid HTTP header")
    )
    if judged.url is None or bad_header is not None:
        return PreparedTarget(judged, bad_header, None, b"", False)
    endpoint = endpoint_of(judged.url)
    sent = _fixed_headers(headers)
    lines = "".join([f"{name}: {value}\r\n" for name, value in sent.items()])
    head = f"{method} {endpoint.target} HTTP/1.1\r\nHost: {endpoint.authority}\r\n{_DEFAULT_HEAD}{lines}"
    return PreparedTarget(
        judged, None, endpoint, head.encode("utf-8", "ignore"), job_traceparent=TRACEPARENT in sent
    )


def request_bytes(
    prepared: PreparedTarget, target: WebhookTarget, d: Delivery, body: bytes, now: datetime
) -> bytes:
    """The whole request: the target's remembered head, the contract's lines, the body."""
    if prepared.job_traceparent and d.traceparent is not None:
        headers = request_headers(target, contract_headers(d, body, now))
        headers[TRACEPARENT] = d.traceparent
        assert prepared.endpoint is not None
        return http1.encode_request(target.method.value, prepared.endpoint, _DEFAULT_HEAD, headers, body)
    return b"".join((prepared.head, contract_head(d, body, now).encode("utf-8", "ignore"), body))


class CheckedResolver:
    """Resolves through ``core.ssrf.resolve_checked`` and returns only addresses it allowed.

    A host that is an address literal is judged by ``ssrf.judge_literal`` alone, a pure function
    of the text and the policy, so its answer is remembered (a refusal is not: it is raised again
    every time); a name is resolved and checked for every new connection, as always."""

    def __init__(self, policy: ssrf.AddressPolicy) -> None:
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        literal = _literal_results(host, port, family, self._policy)
        if literal is not None:
            return [result.copy() for result in literal]
        addresses = await ssrf.resolve_checked(host, port, self._policy)
        return _results(host, port, family, addresses)


@functools.lru_cache(maxsize=URL_CACHE_SIZE)
def _literal_results(
    host: str, port: int, family: socket.AddressFamily, policy: ssrf.AddressPolicy
) -> tuple[ResolveResult, ...] | None:
    """What ``CheckedResolver.resolve`` answers for an address literal (None for a name): the
    first step of ``resolve_checked``, which needs no DNS."""
    literal = ssrf.judge_literal(host, policy)
    if literal is None:
        return None
    return tuple(_results(host, port, family, [literal]))


def _results(
    host: str, port: int, family: socket.AddressFamily, addresses: list[ssrf.IPAddress]
) -> list[ResolveResult]:
    results: list[ResolveResult] = []
    for address in addresses:
        ip = ipaddress.ip_address(str(address))
        af = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        if family not in (socket.AF_UNSPEC, af):
            continue
        results.append(
            ResolveResult(
                hostname=host,
                host=str(ip),
                port=port,
                family=af,
                proto=socket.IPPROTO_TCP,
                flags=socket.AI_NUMERICHOST,
            )
        )
    if not results:
        raise ssrf.ResolutionFailed(f"{host} has no allowed address of the wanted family")
    return results


def new_client(
    policy: ssrf.AddressPolicy, *, total_concurrency: int, ssl_context: ssl.SSLContext | None = None
) -> http1.Http1Pool:
    """The one keep-alive client a worker shares between all webhook calls: at most
    ``total_concurrency`` connections open, each new one resolved and checked again.

    ``ssl_context`` replaces the system trust store (e.g. an operator's internal CA); certificate
    and host name verification stay on either way.
    """
    return http1.Http1Pool(CheckedResolver(policy), limit=total_concurrency, ssl_context=ssl_context)


async def call(
    client: http1.Http1Pool,
    *,
    policy: ssrf.AddressPolicy,
    d: Delivery,
    target: WebhookTarget,
    body: bytes,
    now: datetime,
) -> Verdict:
    """One attempt; every failure of the target comes back as a ``Verdict``, never raised."""
    prepared = prepare(target, policy)
    judged = prepared.judged
    if judged.refusal is not None:
        return judged.refusal
    if judged.resolve_literal:
        refused = await _check_literal(judged, policy)
        if refused is not None:
            return refused
    if prepared.bad_header is not None:
        return prepared.bad_header
    endpoint = prepared.endpoint
    assert endpoint is not None
    request = request_bytes(prepared, target, d, body, now)
    try:
        answer = await client.request(endpoint, request, target.timeout_s)
    except Exception as exc:
        verdict = failure_verdict(exc, target.timeout_s, endpoint, judged.host)
        if verdict is None:
            raise
        return verdict
    return answer_verdict(answer)


@dataclasses.dataclass(frozen=True, slots=True)
class Started:
    """A webhook call in flight with no task or coroutine of its own (``begin``).

    ``answer`` resolves when the target answered or the call failed (await it, or give it a done
    callback); ``verdict()`` then reads the call's verdict from it. Cancelling ``answer`` abandons
    the call (see ``Http1Pool.send``).
    """

    answer: asyncio.Future[http1.Answer | Verdict]
    timeout_s: float
    endpoint: http1.Endpoint
    host: str

    def verdict(self) -> Verdict:
        """The verdict of the finished call, as ``call`` returns it (an unexpected error, not
        the target's, is raised)."""
        try:
            result = self.answer.result()
        except Exception as exc:
            verdict = failure_verdict(exc, self.timeout_s, self.endpoint, self.host)
            if verdict is None:
                raise
            return verdict
        if isinstance(result, Verdict):
            return result
        return answer_verdict(result)


def begin(
    client: http1.Http1Pool,
    *,
    policy: ssrf.AddressPolicy,
    d: Delivery,
    target: WebhookTarget,
    body: bytes,
    now: datetime,
) -> Verdict | Started:
    """``call`` without a task: the attempt's verdict when it is decided before any request (a
    refused URL, a bad job header), else the call, started.

    On an idle pooled connection the request is written before this returns and nothing is
    made for it but its future (``Http1Pool.send``): a caller that starts many calls (one pump
    per host) spends no task, coroutine or timer per call. A host that must be resolved and
    checked before every call (``JudgedUrl.resolve_literal``, rare) runs ``call`` in a task."""
    prepared = prepare(target, policy)
    judged = prepared.judged
    if judged.refusal is not None:
        return judged.refusal
    endpoint = prepared.endpoint
    if judged.resolve_literal:
        assert judged.url is not None
        endpoint = endpoint_of(judged.url)
        answer: asyncio.Future[http1.Answer | Verdict] = client.loop.create_future()
        task = client.loop.create_task(
            _call_into(answer, client, policy=policy, d=d, target=target, body=body, now=now)
        )
        _CALLS_IN_TASKS.add(task)
        task.add_done_callback(_CALLS_IN_TASKS.discard)
        answer.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)
        return Started(answer, target.timeout_s, endpoint, judged.host)
    if prepared.bad_header is not None:
        return prepared.bad_header
    assert endpoint is not None
    sent = client.send(endpoint, request_bytes(prepared, target, d, body, now), target.timeout_s)
    return Started(
        cast("asyncio.Future[http1.Answer | Verdict]", sent), target.timeout_s, endpoint, judged.host
    )


# The few calls ``begin`` runs as tasks: held here, as the loop keeps only weak references to tasks.
_CALLS_IN_TASKS: set[asyncio.Task[None]] = set()


async def _call_into(
    answer: asyncio.Future[http1.Answer | Verdict],
    client: http1.Http1Pool,
    *,
    policy: ssrf.AddressPolicy,
    d: Delivery,
    target: WebhookTarget,
    body: bytes,
    now: datetime,
) -> None:
    try:
        verdict = await call(client, policy=policy, d=d, target=target, body=body, now=now)
    except asyncio.CancelledError:
        answer.cancel()
        raise
    except Exception as exc:
        if not answer.done():
            answer.set_exception(exc)
        return
    if not answer.done():
        answer.set_result(verdict)


async def _check_literal(judged: JudgedUrl, policy: ssrf.AddressPolicy) -> Verdict | None:
    """The check ``resolve_checked`` makes of a host that looks like an address literal the
    guard does not read as one, at every call; None when it is allowed."""
    host = judged.host
    assert judged.url is not None
    try:
        await ssrf.resolve_checked(host, judged.url.port or 0, policy)
    except TargetNotAllowed as exc:
        return Verdict(Outcome.FAILED, False, None, f"target_not_allowed: {exc.message}")
    except (InvalidRequest, ValueError):
        return Verdict(Outcome.FAILED, False, None, "invalid webhook URL")
    except ssrf.ResolutionFailed:
        return Verdict(Outcome.FAILED, True, None, f"name resolution failed for {host}")
    return None


def answer_verdict(answer: http1.Answer) -> Verdict:
    """The verdict of a target's answer: its status's, with a 429/503's ``Retry-After``."""
    verdict = classify_status(answer.status)
    if answer.retry_after is None:
        return verdict
    wait = retry_after_s(answer.status, answer.retry_after, datetime.now(UTC))
    if wait is not None:
        # Read here, applied by the retry layer (core/retry.py): nothing retries in this module.
        verdict = dataclasses.replace(verdict, retry_after_s=wait)
    return verdict


def failure_verdict(
    exc: BaseException, timeout_s: float, endpoint: http1.Endpoint, host: str
) -> Verdict | None:
    """The verdict of a call that got no answer, by how it failed; None for an error that is
    not the target's (a bug, the client closed), which the caller raises."""
    if isinstance(exc, TargetNotAllowed):
        return Verdict(Outcome.FAILED, False, None, f"target_not_allowed: {exc.message}")
    if isinstance(exc, TimeoutError):
        return Verdict(Outcome.TIMED_OUT, True, None, f"no answer within {timeout_s}s")
    if isinstance(exc, ssrf.ResolutionFailed):
        return Verdict(Outcome.FAILED, True, None, f"name resolution failed for {host}")
    if isinstance(exc, http1.CertificateRejected):
        return Verdict(Outcome.FAILED, True, None, f"TLS certificate of {host} not accepted")
    if isinstance(exc, http1.ConnectFailed):
        if isinstance(exc.os_error, ConnectionRefusedError):
            reason = "connection refused"
        else:
            reason = exc.os_error.strerror or type(exc.os_error).__name__
        return Verdict(Outcome.FAILED, True, None, f"cannot connect to {host}:{endpoint.port}: {reason}")
    if isinstance(exc, http1.ClosedBeforeAnswer):
        return Verdict(Outcome.FAILED, True, None, "connection closed before an answer")
    if isinstance(exc, http1.InvalidAnswer):
        return Verdict(Outcome.FAILED, True, None, INVALID_ANSWER)
    if isinstance(exc, ValueError):
        # Something on the way refused the URL's parts (e.g. a host name TLS cannot encode):
        # final, with the text aiohttp's refusals had.
        return Verdict(Outcome.FAILED, False, None, "request refused by the HTTP client (invalid header)")
    return None
