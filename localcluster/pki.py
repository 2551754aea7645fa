"""The cluster's certificates: a CA, one client certificate per identity, two serving certificates,
and the service-account key pair, made with the ``openssl`` command (EC P-256: fast)."""

from __future__ import annotations

import os
from pathlib import Path

from localcluster.host import run_command
from localcluster.layout import NODE_NAME

# Client identities: (file stem, CN, O). system:masters for the controller manager and the
# apiserver's kubelet client keeps RBAC out of the way; kubelet and scheduler use their real roles.
CLIENT_CERTS: tuple[tuple[str, str, str], ...] = (
    ("admin", "gpushare-admin", "system:masters"),
    ("controller-manager", "system:kube-controller-manager", "system:masters"),
    ("scheduler", "system:kube-scheduler", ""),
    ("kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
    ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
)
SERVER_CERTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "apiserver",
        "kube-apiserver",
        ("IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default"),
    ),
    ("kubelet-serving", "gpushare-kubelet", ("IP:127.0.0.1", "DNS:localhost")),
)


def make_pki(pki: Path) -> None:
    """A CA, server and client certificates (EC P-256, fast) and the service-account RSA key pair."""
    pki.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str | Path) -> None:
        run_command(["openssl", *(str(a) for a in args)])

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca_crt, ca_key = pki / "ca.crt", pki / "ca.key"
    ca_ext = ("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl(
        "req", "-x509", *ec, "-days", "30", "-keyout", ca_key, "-out", ca_crt, "-subj", "/CN=gpushare-test-ca", *ca_ext
    )

    def leaf(stem: str, subject: str, ext: str) -> None:
        key, csr, crt, extfile = (pki / f"{stem}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
        extfile.write_text(ext)
        openssl("req", "-new", *ec, "-keyout", key, "-out", csr, "-subj", subject)
        serial = str(int.from_bytes(os.urandom(8), "big"))
        openssl(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_crt,
            "-CAkey",
            ca_key,
            "-set_serial",
            serial,
            "-days",
            "30",
            "-extfile",
            extfile,
            "-out",
            crt,
        )

    for stem, cn, org in CLIENT_CERTS:
        subject = (f"/O={org}" if org else "") + f"/CN={cn}"
        leaf(stem, subject, "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n")
    for stem, cn, sans in SERVER_CERTS:
        ext = f"keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName={','.join(sans)}\n"
        leaf(stem, f"/CN={cn}", ext)
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", pki / "sa.key")
    openssl("pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
