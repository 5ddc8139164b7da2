"""TLS trust for what a process sends out of the cluster: the system's CAs plus the PEM files in
the directories of `SSL_CERT_DIR`, the way Go programs read that variable (the collectors in the
same install do). OpenSSL, under Python, looks in those directories only for hashed file names
(`c_rehash`), so a mounted `ca.crt` would otherwise be ignored by Python and used by Go.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

log = logging.getLogger("lumigo.trust")

CERT_DIR_ENV = "SSL_CERT_DIR"


def extra_ca_files(environ: dict[str, str] | None = None) -> list[Path]:
    """Every regular file in the `SSL_CERT_DIR` directories (colon-separated), sorted; none if
    unset. Hidden entries (a mounted ConfigMap's `..data`) are skipped."""
    value = (os.environ if environ is None else environ).get(CERT_DIR_ENV, "")
    files: list[Path] = []
    for directory in filter(None, value.split(":")):
        path = Path(directory)
        if path.is_dir():
            files += sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith("."))
    return files


def upstream_context(environ: dict[str, str] | None = None) -> ssl.SSLContext:
    """A verifying client context trusting the system's CAs and the extra ones. A file that holds
    no certificate is skipped with a warning, as Go skips it: it must not stop the exports."""
    context = ssl.create_default_context()
    for path in extra_ca_files(environ):
        try:
            context.load_verify_locations(cafile=str(path))
        except (ssl.SSLError, OSError) as err:
            log.warning(
                "not a CA certificate file, skipped", extra={"file": str(path), "error": str(err)}
            )
    return context
