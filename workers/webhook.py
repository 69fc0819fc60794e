"""Webhook targets: one HTTP request per attempt, exactly as docs/targets.md describes it.

Two things here are about safety rather than HTTP:

* SSRF is checked again at call time, and the connection goes to the address that was checked.
  ``CheckedResolver`` is the only resolver the session has, so aiohttp never looks a name up on
  its own: a name that resolved to a public address at check time cannot be re-pointed (DNS
  rebinding) at a private one for the connect. The URL keeps its host name, so the Host header,
  TLS SNI and certificate verification all still use the name.
* The session is shared by every owner's targets, so it keeps no cookies, reads no proxy settings
  from the environment and never follows a redirect (a 3xx could point anywhere).

Nothing in this module retries: a failure is classified (retryable or not) and handed back to the
scheduler, the one layer that retries.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import socket
import ssl
from datetime import UTC, datetime

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.helpers import is_ip_address
from yarl import URL

from duetime.core import signing, ssrf
from duetime.core.errors import InvalidRequest, TargetNotAllowed
from duetime.core.headers import is_reserved_header
from duetime.core.model import Outcome, WebhookTarget
from duetime.core.retry import retry_after_s
from duetime.core.runpath import Delivery, Verdict
from duetime.workers.tracing import TRACEPARENT

MAX_RESPONSE_READ = 64 * 1024
USER_AGENT = "Duetime-Webhook/1"


# RFC 9110 field-name token, and a value with no control characters but tab.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def classify_status(status: int) -> Verdict:
    """The contract's table: 2xx succeeds; 408, 429, 5xx are retried; anything else is final."""
    if 200 <= status < 300:
        return Verdict(Outcome.SUCCEEDED, False, status, None)
    if 300 <= status < 400:
        return Verdict(Outcome.FAILED, False, status, f"redirect refused (HTTP {status})")
    if status in (408, 429) or status >= 500:
        return Verdict(Outcome.FAILED, True, status, f"HTTP {status}")
    return Verdict(Outcome.FAILED, False, status, f"HTTP {status}")


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


def request_headers(target: WebhookTarget, contract: dict[str, str]) -> dict[str, str]:
    """The job's headers first, then ours; a job header that names one of ours is dropped."""
    headers = {k: v for k, v in target.headers.items() if not is_reserved_header(k)}
    headers["Content-Type"] = "application/json"
    headers.update(contract)
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

    ``resolve_literal`` marks a host that aiohttp takes for an address literal (so its resolver
    will not be asked) but that the guard's parser does not read as one: such a host goes
    through ``ssrf.resolve_checked`` at every call, as before, instead of being remembered.
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
        # aiohttp skips the resolver for whatever it takes for an address literal (its own test,
        # used here so the two cannot disagree), so such a host is checked here instead.
        if is_ip_address(host) and ssrf.judge_literal(host, policy) is None:
            return JudgedUrl(url, host, None, resolve_literal=True)
    except TargetNotAllowed as exc:
        refused = Verdict(Outcome.FAILED, False, None, f"target_not_allowed: {exc.message}")
        return JudgedUrl(None, host, refused)
    except (InvalidRequest, ValueError):
        return JudgedUrl(None, host, Verdict(Outcome.FAILED, False, None, "invalid webhook URL"))
    return JudgedUrl(url, host, None)


@functools.lru_cache(maxsize=64)
def _timeout(total_s: float) -> aiohttp.ClientTimeout:
    """One (immutable) timeout object per distinct ``timeout_s``, not one per call."""
    return aiohttp.ClientTimeout(total=total_s)


class CheckedResolver(AbstractResolver):
    """Resolves through ``core.ssrf.resolve_checked`` and returns only addresses it allowed."""

    def __init__(self, policy: ssrf.AddressPolicy) -> None:
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await ssrf.resolve_checked(host, port, self._policy)
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

    async def close(self) -> None:
        return None


def new_session(
    policy: ssrf.AddressPolicy, *, total_concurrency: int, ssl_context: ssl.SSLContext | None = None
) -> aiohttp.ClientSession:
    """The one keep-alive session a worker shares between all webhook calls.

    ``ssl_context`` replaces the system trust store (e.g. an operator's internal CA); certificate
    and host name verification stay on either way.
    """
    connector = aiohttp.TCPConnector(
        ssl=ssl_context if ssl_context is not None else True,
        resolver=CheckedResolver(policy),
        # Every new connection resolves (and so is checked) again; pooled ones stay on the
        # address they were checked for.
        use_dns_cache=False,
        family=socket.AF_UNSPEC,
        limit=total_concurrency,
        limit_per_host=0,
    )
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        headers={"User-Agent": USER_AGENT},
        auto_decompress=False,
    )


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read (and drop) a bounded amount of the answer so a small one leaves the connection reusable."""
    remaining = MAX_RESPONSE_READ
    try:
        while remaining > 0:
            chunk = await response.content.read(remaining)
            if not chunk:
                return
            remaining -= len(chunk)
    except (aiohttp.ClientError, TimeoutError):
        # The status already decided the outcome; an unread tail only costs this connection.
        pass
    response.close()


def _is_resolution_failure(exc: BaseException) -> bool:
    return isinstance(exc, ssrf.ResolutionFailed) or isinstance(exc.__cause__, ssrf.ResolutionFailed)


async def call(
    session: aiohttp.ClientSession,
    *,
    policy: ssrf.AddressPolicy,
    d: Delivery,
    target: WebhookTarget,
    body: bytes,
    now: datetime,
) -> Verdict:
    """One attempt; every failure of the target comes back as a ``Verdict``, never raised."""
    judged = judge_url(target.url, policy)
    if judged.refusal is not None:
        return judged.refusal
    url, host = judged.url, judged.host
    assert url is not None  # a URL that did not parse carries a refusal
    if judged.resolve_literal:
        try:
            await ssrf.resolve_checked(host, url.port or 0, policy)
        except TargetNotAllowed as exc:
            return Verdict(Outcome.FAILED, False, None, f"target_not_allowed: {exc.message}")
        except (InvalidRequest, ValueError):
            return Verdict(Outcome.FAILED, False, None, "invalid webhook URL")
        except ssrf.ResolutionFailed:
            return Verdict(Outcome.FAILED, True, None, f"name resolution failed for {host}")

    bad = invalid_header(target.headers)
    if bad is not None:
        return Verdict(Outcome.FAILED, False, None, f"job header {bad[:100]!r} is not a valid HTTP header")
    headers = request_headers(target, contract_headers(d, body, now))
    if d.traceparent is not None:
        headers[TRACEPARENT] = d.traceparent
    timeout = _timeout(target.timeout_s)
    try:
        async with session.request(
            target.method.value,
            url,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=timeout,
        ) as response:
            verdict = classify_status(response.status)
            wait = retry_after_s(response.status, response.headers.get("Retry-After"), datetime.now(UTC))
            if wait is not None:
                # Read here, applied by the retry layer (core/retry.py): nothing retries in this module.
                verdict = dataclasses.replace(verdict, retry_after_s=wait)
            await _drain(response)
            return verdict
    except TargetNotAllowed as exc:
        return Verdict(Outcome.FAILED, False, None, f"target_not_allowed: {exc.message}")
    except TimeoutError:
        return Verdict(Outcome.TIMED_OUT, True, None, f"no answer within {target.timeout_s}s")
    except aiohttp.ClientConnectorDNSError:
        return Verdict(Outcome.FAILED, True, None, f"name resolution failed for {host}")
    except aiohttp.ClientConnectorCertificateError:
        return Verdict(Outcome.FAILED, True, None, f"TLS certificate of {host} not accepted")
    except aiohttp.ClientConnectorError as exc:
        if _is_resolution_failure(exc):
            return Verdict(Outcome.FAILED, True, None, f"name resolution failed for {host}")
        if isinstance(exc.os_error, ConnectionRefusedError):
            reason = "connection refused"
        else:
            reason = exc.os_error.strerror or type(exc.os_error).__name__
        return Verdict(Outcome.FAILED, True, None, f"cannot connect to {host}:{url.port}: {reason}")
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError):
        return Verdict(Outcome.FAILED, True, None, "connection closed before an answer")
    except aiohttp.InvalidURL:
        return Verdict(Outcome.FAILED, False, None, "invalid webhook URL")
    except ValueError:
        # aiohttp refuses to build the request (a header or URL it will not send): final.
        return Verdict(Outcome.FAILED, False, None, "request refused by the HTTP client (invalid header)")
    except aiohttp.ClientError as exc:
        if _is_resolution_failure(exc):
            return Verdict(Outcome.FAILED, True, None, f"name resolution failed for {host}")
        return Verdict(Outcome.FAILED, True, None, f"invalid answer ({type(exc).__name__})")
    except ssrf.ResolutionFailed:
        return Verdict(Outcome.FAILED, True, None, f"name resolution failed for {host}")
