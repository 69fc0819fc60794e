"""Duetime: a distributed job scheduler. ``duetime.client`` is the owners' client; the rest is the
server (``duetime.core`` pure, ``duetime.storage``, ``duetime.engine``, ``duetime.workers``,
``duetime.api``, and the composition root ``duetime.app`` / ``duetime.cli``)."""

from duetime._version import __version__

__all__ = ["__version__"]
