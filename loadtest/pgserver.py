"""A private PostgreSQL with the tuning ``duetime run`` gives its own server, for benchmarks.

The shared server on a development machine runs at PostgreSQL's defaults (``shared_buffers``
128 MB, ``max_wal_size`` 1 GB, no ``wal_compression``): at a million runs its checkpoints come
every few seconds of the drain, each followed by full-page images of every page touched again,
and backends evict dirty buffers themselves. ``duetime run`` tunes its embedded server for a
scheduler's write load (``duetime.embedded_pg.TUNING``). This starts such a server in a scratch
directory and prints the admin DSN for the benchmarks' ``DUETIME_BENCH_PG``, so a burst can be
measured against the configuration Duetime itself recommends as well as against the defaults:

    python -m loadtest.pgserver --dir /var/tmp/duetime-bench-pg &
    DUETIME_BENCH_PG=<the printed DSN> python -m loadtest.burst --jobs 1000000 ...

It runs until SIGTERM or SIGINT, then stops the server (fast shutdown). ``--set NAME=VALUE``
changes one setting of the tuning (e.g. ``--set max_wal_size="'8GB'"``).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import uvloop

from duetime.embedded_pg import TUNING, EmbeddedPostgres


async def serve(data_dir: Path, tuning: dict[str, str]) -> None:
    async with EmbeddedPostgres(data_dir, tuning=tuning) as pg:
        # The admin DSN: the benchmarks create and drop their scratch databases from "postgres".
        print(pg.dsn.rpartition("/")[0] + "/postgres", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="the server's data directory (kept)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="one setting")
    a = p.parse_args(argv)
    tuning = dict(TUNING)
    for item in a.set:
        name, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set {item!r}: expected NAME=VALUE, e.g. max_wal_size=\"'8GB'\"")
        tuning[name.strip()] = value.strip()
    uvloop.run(serve(a.dir, tuning))


if __name__ == "__main__":
    main()
