"""The shared fixtures (tests/support/fixtures.py, tests/support/tls.py) for the tests of this folder."""

from tests.support.fixtures import node, own_db, owner, receiver
from tests.support.tls import tls_cert

__all__ = ["node", "own_db", "owner", "receiver", "tls_cert"]
