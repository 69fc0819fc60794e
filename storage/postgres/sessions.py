"""The bounds every PostgreSQL session of a Duetime server lives under (``SessionBounds``), and the
one way to open a connection outside the pools with them."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True, slots=True)
class SessionBounds:
    """How long a session of ours may hold what it holds, set on every connection Duetime opens to
    serve (pools and LISTEN connections). 0 switches a bound off.

    Why: without them a process paused inside a transaction (SIGSTOP, a swapped-out VM) kept up to
    a batch of rows locked for as long as it was paused; a statement stuck behind a lock waited
    for ever; a primary cut off without a reset left statements hanging for the kernel's ~15
    minutes of retransmissions; a vanished client's session lived for the OS's two-hour keepalive.
    The defaults free a stuck transaction's locks well within one lease (30 s)."""

    statement_timeout_s: float = 20.0
    lock_timeout_s: float = 10.0
    idle_in_transaction_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    keepalives_idle_s: float = 5.0

    def server_settings(self) -> dict[str, str]:
        """The session's settings, as PostgreSQL takes them in the startup packet (ms, seconds)."""
        out = {
            "statement_timeout": str(round(self.statement_timeout_s * 1000)),
            "lock_timeout": str(round(self.lock_timeout_s * 1000)),
            "idle_in_transaction_session_timeout": str(round(self.idle_in_transaction_timeout_s * 1000)),
        }
        if self.keepalives_idle_s > 0:
            # The server's side of the socket: it notices a client that vanished, and ends the
            # session (and its transaction) after idle + 3 probes 2 s apart.
            out["tcp_keepalives_idle"] = str(max(1, round(self.keepalives_idle_s)))
            out["tcp_keepalives_interval"] = "2"
            out["tcp_keepalives_count"] = "3"
        return out

    @property
    def command_timeout_s(self) -> float | None:
        """The client's own bound on a statement: the server's plus 5 s, for a server that can no
        longer say it cancelled anything (cut off without a reset). None: no bound."""
        return self.statement_timeout_s + 5.0 if self.statement_timeout_s > 0 else None


async def connect(dsn: str, bounds: SessionBounds) -> asyncpg.Connection:
    """One connection outside the pools (LISTEN), under the same bounds."""
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn,
        timeout=bounds.connect_timeout_s,
        command_timeout=bounds.command_timeout_s,
        server_settings=bounds.server_settings(),
    )
    return conn
