"""The shared fixtures (tests/support/fixtures.py) for the tests of this folder."""

from tests.support.fixtures import client, db, node, own_db, owner, receiver, store

__all__ = ["client", "db", "node", "own_db", "owner", "receiver", "store"]
