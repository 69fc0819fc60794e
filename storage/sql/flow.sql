-- Flow control (storage/postgres/flow.py): the cluster-wide limits of flow keys, on the home
-- database. The work is the function duetime_take_flow (migration 0015, which says why it is a
-- function); this is the one statement that calls it.

-- name: take_flow
-- $1 the worker; $2..$8 one array element per ask (owner, key, rate_per_s, bucket capacity,
-- parallelism, want, running); $9 seconds the worker's slots stay held. One row per ask.
SELECT ask, granted
FROM duetime_take_flow(
    $1::text, $2::text[], $3::text[], $4::double precision[], $5::double precision[],
    $6::integer[], $7::integer[], $8::integer[], $9::double precision
);
