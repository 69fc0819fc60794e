"""A webhook target for Duetime in aiohttp: signature, fencing and de-duplication, in that order.

Run it (with Duetime installed, ``pip install -e .``)::

    DUETIME_SIGNING_SECRET=whsec_... python examples/receiver_aiohttp.py --port 9000
    # several replicas share their state through Redis:
    DUETIME_SIGNING_SECRET=whsec_... python examples/receiver_aiohttp.py --redis redis://127.0.0.1:6379/0

and point a job's target at ``http://<host>:9000/hook``. The order of the checks matters:

1. the signature first, so nothing unauthenticated touches the stores (401, not retried by a
   sender that is not Duetime, and a misconfigured secret shows up at once in the run history);
2. the fencing token next: a call from a worker whose lease was taken over is refused with 409,
   a 4xx that Duetime does not retry (the newer holder's call is, or was, the one that counts);
3. the Idempotency-Key last: a redelivery of finished work is acknowledged with 200 and not done
   again; one that arrives while the first is still working gets 503 with Retry-After, so Duetime
   retries it later instead of taking "done" for work that may still fail.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from duetime.receiver import (
    Claim,
    Deduplicator,
    DeliveryHeaders,
    FencingGuard,
    MemoryFencingStore,
    MemoryIdempotencyStore,
    RedisFencingStore,
    RedisIdempotencyStore,
    verify_webhook,
)

log = logging.getLogger("receiver")

Work = Callable[[DeliveryHeaders, Any], Awaitable[None]]


async def log_work(delivery: DeliveryHeaders, payload: Any) -> None:
    """The receiver's real work goes here; this one only logs the occurrence and its context
    (docs/targets.md, "Run context": e.g. work on what changed since the last success)."""
    log.info(
        "job %s occurrence %s attempt %d (last success %s): %r",
        delivery.job_id,
        delivery.scheduled_for,
        delivery.attempt,
        delivery.last_success_scheduled_for or "none",
        payload,
    )
    if delivery.folded_count:
        log.info("it stands for %d missed occurrences from %s", delivery.folded_count, delivery.folded_from)


def make_app(secret: str, dedup: Deduplicator, fence: FencingGuard, work: Work = log_work) -> web.Application:
    async def hook(request: web.Request) -> web.Response:
        body = await request.read()  # the raw bytes: the signature covers them exactly
        if not verify_webhook(secret, request.headers, body):
            return web.json_response({"error": "bad or stale signature"}, status=401)
        try:
            delivery = DeliveryHeaders.parse(request.headers)
            payload = json.loads(body) if body else None
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if not await fence.admit(delivery.job_id, delivery.fencing_token):
            return web.json_response(
                {"error": "a newer lease holder has called; this call is stale"}, status=409
            )
        async with dedup.once(delivery.idempotency_key) as claim:
            if claim is Claim.DONE:
                return web.json_response({"status": "duplicate"})
            if claim is Claim.PENDING:
                return web.json_response({"status": "in progress"}, status=503, headers={"Retry-After": "5"})
            await work(delivery, payload)  # an exception here frees the key: the retry redoes the work
        return web.json_response({"status": "done"})

    app = web.Application()
    app.router.add_post("/hook", hook)
    app.router.add_put("/hook", hook)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--redis", help="redis:// URL to share keys and tokens between replicas")
    args = parser.parse_args()
    secret = os.environ.get("DUETIME_SIGNING_SECRET")
    if not secret:
        raise SystemExit("set DUETIME_SIGNING_SECRET to the owner's whsec_... secret")
    logging.basicConfig(level=logging.INFO)

    async def build() -> web.Application:
        if args.redis:
            from redis.asyncio import Redis

            redis = Redis.from_url(args.redis)
            app = make_app(
                secret, Deduplicator(RedisIdempotencyStore(redis)), FencingGuard(RedisFencingStore(redis))
            )

            async def close_redis(_: web.Application) -> None:
                await redis.aclose()

            app.on_cleanup.append(close_redis)
            return app
        return make_app(secret, Deduplicator(MemoryIdempotencyStore()), FencingGuard(MemoryFencingStore()))

    web.run_app(build(), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
