"""The one reading of a webhook URL: scheme, host and port, for validation, the SSRF guard and
the origin comparison of a PATCH.

Registration (``core.validation``) and the SSRF guard (``core.ssrf``) used to split URLs each
their own way; two parsers of one security-relevant string are two chances to disagree about
which host a URL names (userinfo, brackets, a port that is not a number). Both now take the host
and port from ``split_webhook_url``; validation adds its stricter rules about what an owner may
store on top, and the guard judges the host this function returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from duetime.core.errors import InvalidRequest

URL_FIELD = "target.url"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class WebhookUrl:
    """An http(s) URL's parts that decide where a call goes."""

    scheme: str  # lower case: http or https
    host: str  # as written, IPv6 literals with their brackets
    port: int  # the explicit port, else the scheme's default
    userinfo: bool = False  # the authority has a ``user[:password]@`` part

    @property
    def origin(self) -> tuple[str, str, int]:
        """(scheme, host, port) as RFC 6454 compares them: host in lower case, no trailing dot."""
        return self.scheme, self.host.lower().rstrip("."), self.port


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_url", field=field)


def split_webhook_url(url: str, field: str = URL_FIELD) -> WebhookUrl:
    """The scheme, host and port of ``url``, or ``InvalidRequest`` (``invalid_url``).

    The host is whatever follows the last ``@`` of the authority (that is where every HTTP
    client connects), so userinfo can never hide the real host from a check.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _invalid(
            field, f"{field} is not a valid URL ({exc}); write it as https://host[:port]/path"
        ) from None
    try:
        port = parts.port
    except ValueError:
        raise _invalid(field, f"{field} has an invalid port; use a number from 1 to 65535") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise _invalid(
            field, f"{field} must be an http:// or https:// URL (got scheme {parts.scheme[:20]!r})"
        )
    if not url[len(parts.scheme) + 1 :].startswith("//") or not parts.netloc:
        raise _invalid(field, f"{field} has no host; write it as https://host/path")
    if port == 0:
        raise _invalid(field, f"{field} has port 0; use a number from 1 to 65535")
    netloc = parts.netloc.rpartition("@")[2]
    if netloc.startswith("["):
        host = netloc[: netloc.find("]") + 1] if "]" in netloc else netloc
        rest = netloc[len(host) :]
        if rest and not rest.startswith(":"):
            raise _invalid(field, f"{field} has text after the IPv6 literal")
    else:
        host = netloc.rpartition(":")[0] if ":" in netloc else netloc
    if not host:
        raise _invalid(field, f"{field} has no host; write it as https://host/path")
    return WebhookUrl(
        scheme=scheme,
        host=host,
        port=port if port is not None else _DEFAULT_PORTS[scheme],
        userinfo="@" in parts.netloc,
    )


def same_origin(a: str, b: str) -> bool:
    """True when two webhook URLs call the same scheme, host and port; an unreadable one never is."""
    try:
        return split_webhook_url(a).origin == split_webhook_url(b).origin
    except InvalidRequest:
        return False
