"""Throwaway TLS certificates for tests (openssl CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_certs(directory: Path) -> dict:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=snowfence-test-ca")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "root")):
        run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        )
    return {
        "ca": directory / "ca.pem",
        "server_cert": directory / "server.pem",
        "server_key": directory / "server.key",
        "client_cert": directory / "client.pem",
        "client_key": directory / "client.key",
    }
