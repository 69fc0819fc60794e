"""What the engine and the workers share, kept below both so neither imports the other.

The engine fences runs and puts them on a run queue; workers take them off, heartbeat them and
record their outcomes. The queue (in one process, ``inprocess``; across processes, NATS JetStream,
``natsqueue``), the lease keeper that heartbeats runs waiting in it or in flight (``leases``), and
the run path's Prometheus metrics, read stage by stage (``metrics``), are that shared medium. It
depends on ``duetime.storage`` and ``duetime.core`` only (docs/architecture.md, "Layers").
"""
