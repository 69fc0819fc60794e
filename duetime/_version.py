"""The one place Duetime's version is written: the package, ``duetime --version``, ``/healthz``,
the OpenAPI description and ``duetime_build_info`` all read it from here."""

__version__ = "0.3.0"
