"""PostgreSQL implementation of the storage seam, one module per concept:

- ``pools``: a pool per database of the shard map, database errors translated at the seam
- ``sessions``: the bounds every session lives under (statement, lock and idle-in-transaction
  timeouts, keepalives, connect timeout)
- ``rows``: rows decoded into the core's records
- ``hints``: NOTIFY hints that wake a shard's engines, and the engine's LISTEN for them
- ``inserts``: the insert batcher
- ``registry``: jobs, owner actions, backfill, run history, owners, API and idempotency keys
- ``runpath``: claim, fence, heartbeats, release
- ``completion``: the completion writer (attempts finished and occurrences skipped under lease)
- ``maintenance``: the janitor's statements
- ``queue_leases``: the leases of runs published on the NATS run queue
- ``shards``: moving a logical shard between databases
- ``keys``: API keys listed, signing secrets rotated
- ``due_age``: each shard's oldest due row no engine has claimed (a gauge's reading)
- ``membership``: the engines' membership and the engine id's lock (home database)
- ``retention``: the maintenance service's batched deletes
- ``target_health``: workers' reports of the hosts they call, listed per owner (home database)
- ``server_keys``: the installation's own keys (the page cursors' sealing key), home database
- ``store``: ``PostgresStore``, composed of those parts

Their SQL lives in ``storage/sql/<concept>.sql``.
"""

from duetime.storage.ports import CompletionStats
from duetime.storage.postgres.hints import NOTIFY_CHANNEL
from duetime.storage.postgres.rows import job_from_row
from duetime.storage.postgres.shards import ShardMoveReport, move_shard
from duetime.storage.postgres.store import PostgresStore

__all__ = [
    "NOTIFY_CHANNEL",
    "CompletionStats",
    "PostgresStore",
    "ShardMoveReport",
    "job_from_row",
    "move_shard",
]
