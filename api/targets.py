"""``GET /v1/targets``: the hosts of the owner's webhook jobs as the workers see them.

Workers report each host's state and limit, and the owner's calls to it, every few seconds
(workers/health.py); storage adds the live reports up per host (``storage.target_rules``). The
handler only reads the page: like every list of /v1, ``limit`` 1..1000 (100) and an opaque
``cursor``, with the same 422s.
"""

from __future__ import annotations

from aiohttp import web

from duetime.api.handlers import OWNER, cursor_of, limit_of
from duetime.api.paging import PageCursors
from duetime.api.render import json_response, targets_page_to_json
from duetime.storage.ports import TargetHealth


class TargetsApi:
    """The handler, bound to the store's ``TargetHealth`` and the API's cursor seal."""

    def __init__(self, store: TargetHealth, *, cursors: PageCursors) -> None:
        self._store = store
        self._cursors = cursors

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/v1/targets", self.list_targets, name="list_targets", allow_head=False)]

    async def list_targets(self, request: web.Request) -> web.Response:
        owner, limit = request[OWNER], limit_of(request)
        cursor = await self._cursors.open(owner, cursor_of(request))
        page = await self._store.list_targets(owner, limit=limit, cursor=cursor)
        return json_response(targets_page_to_json(await self._cursors.seal(owner, page)))
