"""One error root for the whole product.

Every error a user can cause carries a stable snake_case ``code``, a message that says what was
wrong and how to fix it, and, where one field is at fault, its ``field`` path. The API maps the
class to an HTTP status in one middleware; the CLI prints the message.
"""

from __future__ import annotations


class DuetimeError(Exception):
    """Root of every error Duetime raises on purpose."""

    code = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.field = field


class InvalidRequest(DuetimeError):
    """Well-formed input with values we cannot accept (HTTP 422)."""

    code = "invalid_value"


class MalformedRequest(DuetimeError):
    """Input we cannot even read: bad JSON, wrong types (HTTP 400)."""

    code = "malformed_request"


class NotFound(DuetimeError):
    """No such thing for this owner. Carries the id so logs and messages can name it."""

    code = "not_found"

    def __init__(self, message: str, *, ident: str | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.ident = ident


class Conflict(DuetimeError):
    """The request is valid but the job's state does not allow it (HTTP 409)."""

    code = "state_conflict"


class Contended(Conflict):
    """A healthy database gave way to a concurrent change of the same rows, more often than the
    store retries (HTTP 409): worth sending again, and never an outage."""

    code = "concurrent_update"


class Unauthorized(DuetimeError):
    code = "unauthorized"


class RateLimited(DuetimeError):
    """Too much, too soon (HTTP 429 with ``Retry-After``): the owner's rate (``rate_limited``) or
    the server's bounded queue for heavy work (``server_busy``)."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class StorageUnavailable(DuetimeError):
    """The database could not be reached or refused the write (HTTP 503); nothing was acknowledged."""

    code = "storage_unavailable"


class TopicNotAllowed(InvalidRequest):
    """A queue topic that is Duetime's, the broker's, or outside the owner's streams (HTTP 422)."""

    code = "topic_not_allowed"


class TargetNotAllowed(InvalidRequest):
    """A webhook URL that resolves to an address the operator has not allowed (SSRF guard)."""

    code = "target_not_allowed"


def is_transient(exc: BaseException) -> bool:
    """Whether work that failed with ``exc`` should simply be written again later: the database
    was away, refused for now, or gave way to other work (a deadlock, a serialization failure, a
    lock or statement timeout, a lost connection, a failover to a read-only standby). Nothing of
    the work itself is wrong, so it is retried with backoff and never dropped; any other error is
    the work's own (or a bug), and is isolated rather than retried as it is."""
    return isinstance(exc, (StorageUnavailable, Contended, OSError, TimeoutError))
