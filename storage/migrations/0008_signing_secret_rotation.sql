-- Signing-secret rotation (`duetime keys rotate-secret`): the owner's previous secret and until
-- when it still signs. During that grace every webhook carries a signature under the new and the
-- old secret (Standard Webhooks allows several, space-separated), so a receiver can move from
-- one to the other without a moment in which it refuses genuine calls.
ALTER TABLE owners ADD COLUMN previous_signing_secret text;
ALTER TABLE owners ADD COLUMN previous_valid_until timestamptz;
