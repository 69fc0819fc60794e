-- Server keys (issue 32): secrets of the installation itself, one row per use, on the home
-- database (every database gets the table, as every table; only the home database's is read).
--
-- The first use is the key that seals page cursors (api/cursors.py): every API process must seal
-- and open cursors with the same key, and a restart must not invalidate the cursors clients hold,
-- so the key lives here rather than in a process or a setting. The store makes it at its first
-- read: an INSERT … ON CONFLICT DO NOTHING of 32 random bytes, then a read of what is there, so
-- processes starting at the same moment agree on one key (storage/sql/server_keys.sql).
CREATE TABLE server_keys (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);
