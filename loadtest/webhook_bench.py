"""Client CPU per webhook call, without the engine or the database: the worker's real call path.

``WorkerPool.call`` (secret cache, watchdog, metrics) → ``Dispatcher.call`` (JSON body) →
``workers.webhook.call`` (SSRF check, contract headers and signature, the keep-alive client of
``workers/http1.py``), without the host queues that admit runs to it,
against ``loadtest.common.ReceiverProcess`` in another process, ``--concurrency`` calls in flight
as a node's ``DUETIME_WORKER_CONCURRENCY`` makes them. Reports this process's CPU µs per call
(getrusage: user + system) and calls/s; the receiver's CPU per call is reported beside it (when
this command started the receiver), not added to the client's.

    python -m loadtest.webhook_bench --calls 20000 --concurrency 1024

``--path`` measures a layer alone: ``pool`` (the default, as above), ``call`` (``webhook.call``
with each run's ``Delivery`` built as the pool builds it: no pool, dispatcher or limiter),
``begin`` (the same calls started by ``webhook.begin`` from a pump that keeps ``--concurrency``
in flight from done callbacks: no task or coroutine per call) or ``request``
(``Http1Pool.request`` of one request's bytes, built once: the client alone). The
report counts the connections the client opened during the measured calls: keep-alive reuse is
the calls minus these. ``--answer-ms`` makes the receiver a slow target (each answer that late).

Run it under ``py-spy record --native`` to see where the client's time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import resource
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import uvloop

from duetime.core import signing, ssrf
from duetime.core.model import JobSpec, OneOffSchedule, Outcome, WebhookTarget
from duetime.core.runpath import Delivery, FencedRun, RunSpec, Verdict
from duetime.core.signing import new_signing_secret
from duetime.storage.ports import SigningKeys
from duetime.workers import http1, webhook
from duetime.workers.dispatch import Dispatcher
from duetime.workers.pool import WorkerPool
from loadtest.common import ReceiverProcess, print_report


class _Keys:
    """The only storage the call path reads: the owner's signing secret (cached by the pool)."""

    def __init__(self) -> None:
        self.keys = SigningKeys(new_signing_secret(), None, None)

    async def signing_keys(self, owner: str) -> SigningKeys:
        return self.keys


def _runs(n: int, url: str) -> list[FencedRun]:
    now = datetime.now(UTC)
    spec = RunSpec.of(
        JobSpec(
            schedule=OneOffSchedule(now + timedelta(seconds=1)),
            target=WebhookTarget(url=url, timeout_s=30),
            payload={"bench": True, "n": 1},
        )
    )
    return [
        FencedRun(
            job_id=uuid.uuid4(),
            shard=0,
            owner="bench",
            lease_token=i + 1,
            scheduled_for=now,
            due_at=now,
            attempt=1,
            spec=spec,
            run_kind="one_off",
        )
        for i in range(n)
    ]


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _bench(
    url: str, calls: int, concurrency: int, warmup: int, path: str, *, receiver: ReceiverProcess | None
) -> dict[str, Any]:
    dispatcher = Dispatcher(
        policy=ssrf.AddressPolicy(allow_private=os.environ.get("BENCH_STRICT") != "1"),
        nats_url=None,
        redis_url=None,
    )
    await dispatcher.start()
    keys = _Keys()
    pool = WorkerPool(keys, None, dispatcher, None, concurrency=concurrency)  # type: ignore[arg-type]
    http = dispatcher._http
    assert http is not None
    policy = dispatcher._policy
    secret = keys.keys.current

    async def through_pool(run: FencedRun) -> Outcome:
        return (await pool.call(run)).verdict.outcome

    async def through_call(run: FencedRun) -> Outcome:
        d = Delivery.of(run, signing_secret=secret)
        target = d.target
        assert isinstance(target, WebhookTarget)
        body = signing.encode_body(d.payload)
        now = datetime.now(UTC)
        return (await webhook.call(http, policy=policy, d=d, target=target, body=body, now=now)).outcome

    one = _runs(1, url)[0]
    one_target = one.spec.parsed.target
    assert isinstance(one_target, WebhookTarget)
    judged = webhook.judge_url(url, policy)
    assert judged.url is not None
    endpoint = webhook.endpoint_of(judged.url)
    d1 = Delivery.of(one, signing_secret=secret)
    body1 = signing.encode_body(d1.payload)
    headers1 = webhook.request_headers(one_target, webhook.contract_headers(d1, body1, datetime.now(UTC)))
    request1 = http1.encode_request("POST", endpoint, webhook._DEFAULT_HEAD, headers1, body1)

    async def through_request(run: FencedRun) -> Outcome:
        answer = await http.request(endpoint, request1, 30)
        return Outcome.SUCCEEDED if answer.status == 200 else Outcome.FAILED

    async def pump(runs: list[FencedRun]) -> dict[str, int]:
        """``concurrency`` calls in flight, each finished call starting the next from its done
        callback, as a per-host pump would."""
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        it = iter(runs)
        outcomes: dict[str, int] = {}
        in_flight = 0

        def count(verdict: Verdict) -> None:
            o = verdict.outcome.value
            outcomes[o] = outcomes.get(o, 0) + 1
            if verdict.outcome is not Outcome.SUCCEEDED and outcomes[o] == 1:
                print("first failure:", verdict)

        def start_next() -> None:
            nonlocal in_flight
            for run in it:
                d = Delivery.of(run, signing_secret=secret)
                target = d.target
                assert isinstance(target, WebhookTarget)
                started = webhook.begin(
                    http,
                    policy=policy,
                    d=d,
                    target=target,
                    body=signing.encode_body(d.payload),
                    now=datetime.now(UTC),
                )
                if isinstance(started, Verdict):
                    count(started)
                    continue
                in_flight += 1
                started.answer.add_done_callback(functools.partial(done, started))
                return
            if in_flight == 0 and not finished.done():
                finished.set_result(None)

        def done(started: webhook.Started, _answer: object) -> None:
            nonlocal in_flight
            in_flight -= 1
            count(started.verdict())
            start_next()

        for _ in range(concurrency):
            start_next()
        await finished
        return outcomes

    one_call = {"pool": through_pool, "call": through_call, "request": through_request}.get(
        path, through_pool
    )
    try:

        async def drive(runs: list[FencedRun]) -> dict[str, int]:
            if path == "begin":
                return await pump(runs)
            it = iter(runs)
            outcomes: dict[str, int] = {}

            async def worker() -> None:
                for run in it:
                    outcome = await one_call(run)
                    o = outcome.value
                    outcomes[o] = outcomes.get(o, 0) + 1
                    if outcome is not Outcome.SUCCEEDED and outcomes[o] == 1:
                        print("first failure:", outcome)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return outcomes

        await drive(_runs(warmup, url))
        runs = _runs(calls, url)
        gc.collect()
        made0 = http.connections_made
        cpu0, t0 = _cpu_s(), time.perf_counter()
        peer0 = receiver.cpu_s() if receiver is not None else None
        outcomes = await drive(runs)
        cpu1, t1 = _cpu_s(), time.perf_counter()
        peer1 = receiver.cpu_s() if receiver is not None else None
        made = http.connections_made - made0
        still_open = http.open_connections
    finally:
        await dispatcher.close()
    return {
        "path": path,
        "calls": calls,
        "concurrency": concurrency,
        "outcomes": outcomes,
        "wall_s": round(t1 - t0, 3),
        "calls_per_s": round(calls / (t1 - t0)),
        "client_cpu_us_per_call": round((cpu1 - cpu0) / calls * 1e6, 1),
        "receiver_cpu_us_per_call": (
            round((peer1 - peer0) / calls * 1e6, 1) if peer0 is not None and peer1 is not None else None
        ),
        "connections_opened": made,
        "connections_open_at_end": still_open,
        "load_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=2000)
    p.add_argument("--path", choices=("pool", "call", "begin", "request"), default="pool")
    p.add_argument("--answer-ms", type=float, default=0.0, help="the started receiver answers after this")
    p.add_argument("--url", default=None, help="an already running receiver (default: start one)")
    args = p.parse_args()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)  # as a node (duetime.app.tune_gc)
    receiver = None
    url = args.url
    if url is None:
        receiver = ReceiverProcess(delay_s=args.answer_ms / 1000)
        receiver.start()
        url = receiver.url + "/hook"
    try:
        bench = _bench(url, args.calls, args.concurrency, args.warmup, args.path, receiver=receiver)
        result = uvloop.run(bench)
    finally:
        if receiver is not None:
            receiver.stop()
    print_report(
        "webhook_bench",
        result,
        [
            ("path", result["path"]),
            ("calls", str(result["calls"])),
            ("concurrency", str(result["concurrency"])),
            ("outcomes", str(result["outcomes"])),
            ("calls/s", str(result["calls_per_s"])),
            ("client CPU µs/call", str(result["client_cpu_us_per_call"])),
            ("receiver CPU µs/call", str(result["receiver_cpu_us_per_call"])),
            ("connections opened", str(result["connections_opened"])),
            ("connections open at end", str(result["connections_open_at_end"])),
            ("load (1 min)", str(result["load_1m"])),
        ],
    )


if __name__ == "__main__":
    main()
