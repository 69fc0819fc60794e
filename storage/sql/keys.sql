-- API keys listed and signing secrets rotated (storage/postgres/keys.py). Home database only.

-- name: rotate_signing_secret
-- The current secret becomes the previous one, valid for $3 more seconds; a previous secret of
-- an earlier rotation is dropped (at most two secrets sign at once).
UPDATE owners SET
    previous_signing_secret = signing_secret,
    previous_valid_until = now() + make_interval(secs => $3),
    signing_secret = $2
WHERE owner = $1
RETURNING signing_secret, previous_valid_until;

-- name: signing_keys
SELECT signing_secret, previous_signing_secret, previous_valid_until FROM owners WHERE owner = $1;

-- name: list_api_keys
-- $1 NULL: every owner's keys; $2: revoked ones too.
SELECT key_prefix, owner, created_at, revoked_at FROM api_keys
WHERE ($1::text IS NULL OR owner = $1) AND ($2 OR revoked_at IS NULL)
ORDER BY owner, created_at, key_prefix;
