"""A test's own certificate authority: one self-signed certificate that names only ``TLS_NAME``,
for the webhook tests that check TLS verification (the dispatcher's and the HTTP client's)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

TLS_NAME = "tls.duetime.invalid"


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate (and key) that names only TLS_NAME: the test's own CA."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = [
        *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={TLS_NAME}"),
        *("-addext", f"subjectAltName=DNS:{TLS_NAME}"),
    ]
    subprocess.run(command, check=True, capture_output=True)
    return cert, key
