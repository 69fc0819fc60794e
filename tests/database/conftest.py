"""The shared fixtures (tests/support/fixtures.py) for the tests of this folder."""

from tests.support.fixtures import node, own_db, owner, receiver

__all__ = ["node", "own_db", "owner", "receiver"]
