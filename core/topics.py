"""Which queue topics an owner may publish to: never Duetime's own or the broker's, and, when the
operator says so, only the owner's own.

A queue job's topic is a name on a broker the operator shares between owners and with Duetime
itself. A probe registered ``duetime.runs.0`` (the NATS run queue: the worker dropped the message
as unreadable and logged an ERROR), ``_INBOX.…`` (request/reply inboxes), and Redis keys such as
``__keyspace@0__:x``, and any owner could publish into a stream another owner consumes. The rules:

- Duetime's names are refused: NATS subjects under ``duetime.runs`` or under the run queue's
  configured prefix (``DUETIME_NATS_RUN_SUBJECT``), Redis keys starting ``duetime:`` (the
  receiver's idempotency keys live there).
- Broker-internal names are refused: NATS subjects whose first token starts with ``$`` (``$JS``,
  ``$SYS``, ``$KV``, ``$O``, …) or ``_`` (``_INBOX``, ``_R_``), wildcards (``*``, ``>``) and empty
  tokens; Redis keys starting with ``__`` (``__keyspace@…``, ``__keyevent@…``, ``__redis__``).
- ``TopicPolicy`` adds the operator's per-owner rule (``DUETIME_TOPIC_POLICY``): ``open`` (any
  other name), ``owner_prefix`` (the topic starts with ``DUETIME_TOPIC_PREFIX``, ``{owner}.`` by
  default), or ``allowlist`` (it matches one of ``DUETIME_TOPIC_ALLOWLIST``, where ``{owner}`` is
  the owner and a trailing ``*`` matches any rest).

Registration refuses with 422 ``topic_not_allowed``; the worker asks again before each publish
(the policy may have been tightened since), and a run whose topic is refused fails for good,
unpublished, with the reason in its history.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from duetime.core.model import Broker

TOPIC_FIELD = "target.topic"
OWNER_PLACEHOLDER = "{owner}"


class TopicRule(Enum):
    OPEN = "open"
    OWNER_PREFIX = "owner_prefix"
    ALLOWLIST = "allowlist"


# The default run queue prefix (DUETIME_NATS_RUN_SUBJECT), refused whatever a server's setting:
# a job must not depend on which prefix one deployment chose.
DEFAULT_RUN_SUBJECT = "duetime.runs"
_RESERVED_REDIS = ("duetime:", "__")  # the receiver's keys (duetime:idem:…), Redis's own


def broker_refusal(broker: Broker, topic: str) -> str | None:
    """Why ``topic`` names something no owner may use on ``broker`` (a phrase), or None.

    Names only: the shape of a NATS subject (wildcards, empty tokens) is the validator's, and
    ``TopicPolicy.refusal`` judges it again at publish."""
    if broker is Broker.NATS:
        first = topic.split(".", 1)[0]
        if first.startswith("$"):
            return f"a NATS system subject ({first}.…: JetStream, system or KV/object-store API)"
        if first.startswith("_"):
            return f"a NATS internal subject ({first}.…: request/reply inboxes)"
        if _under(topic.lower(), DEFAULT_RUN_SUBJECT):
            return f"under {DEFAULT_RUN_SUBJECT}, the subject prefix of Duetime's own run queue"
        return None
    lower = topic.lower()
    if lower.startswith("__"):
        return "a Redis internal key (__keyspace@…, __keyevent@…, __redis__…)"
    if lower.startswith(_RESERVED_REDIS):
        return "a key in Duetime's own duetime: namespace"
    return None


def _under(topic: str, prefix: str) -> bool:
    return topic == prefix or topic.startswith(prefix + ".")


def _shape_refusal(broker: Broker, topic: str) -> str | None:
    if broker is not Broker.NATS:
        return None
    tokens = topic.split(".")
    if any(not t for t in tokens):
        return "a NATS subject with an empty token (.. or a leading or trailing dot)"
    if any("*" in t or ">" in t for t in tokens):
        return "a NATS wildcard subject (* or >); a message goes to one concrete subject"
    return None


def _matches(pattern: str, topic: str) -> bool:
    if pattern.endswith("*"):
        return topic.startswith(pattern[:-1])
    return topic == pattern


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """The operator's topic rules; ``reserved_subjects`` are the run queue's own prefixes."""

    rule: TopicRule = TopicRule.OPEN
    prefix: str = OWNER_PLACEHOLDER + "."
    allowlist: tuple[str, ...] = ()
    reserved_subjects: tuple[str, ...] = ("duetime.runs",)

    def refusal(self, broker: Broker, topic: str, owner: str) -> str | None:
        """Why ``owner`` may not publish to ``topic`` (a phrase for a message), or None."""
        reason = _shape_refusal(broker, topic) or broker_refusal(broker, topic)
        if reason is not None:
            return reason
        if broker is Broker.NATS:
            for prefix in self.reserved_subjects:
                if _under(topic, prefix):
                    return f"under {prefix}, the subject prefix of Duetime's own run queue"
        if self.rule is TopicRule.OWNER_PREFIX:
            wanted = self.prefix.replace(OWNER_PLACEHOLDER, owner)
            if not topic.startswith(wanted):
                return f"not under this owner's prefix; this server requires topics to start with {wanted!r}"
        elif self.rule is TopicRule.ALLOWLIST:
            patterns = [p.replace(OWNER_PLACEHOLDER, owner) for p in self.allowlist]
            if not any(_matches(p, topic) for p in patterns):
                shown = ", ".join(repr(p) for p in patterns) or "none"
                return f"not on this server's topic allow-list for this owner (allowed: {shown})"
        return None

    def message(self, topic: str, reason: str) -> str:
        return (
            f"{TOPIC_FIELD} {topic[:100]!r} is {reason}. Pick another topic; an operator sets the "
            "rules with DUETIME_TOPIC_POLICY"
        )
