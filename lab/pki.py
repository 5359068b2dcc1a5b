"""A throw-away PKI for a lab control plane, made with the `openssl` CLI.

Everything is ECDSA P-256 (fast to generate, accepted by kube-apiserver and etcd). Files are
PEM, private keys PKCS#8, written with mode 0600 into one directory.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

DAYS = 3650


class PkiError(RuntimeError):
    """An openssl command failed; the message carries the command and its stderr."""


@dataclass(frozen=True, slots=True)
class CertKey:
    """A certificate and its private key."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class ControlPlanePki:
    """Every file a lab kube-apiserver and its admin client need."""

    ca: CertKey
    apiserver: CertKey
    admin: CertKey
    sa_key: Path
    sa_pub: Path


def generate(
    directory: Path,
    *,
    ips: Sequence[IPv4Address | IPv6Address],
    dns_names: Sequence[str],
    admin_name: str = "nodelb-lab-admin",
) -> ControlPlanePki:
    """Return a fresh CA, apiserver serving cert, admin client cert and SA key pair.

    The serving cert carries `ips` and `dns_names` as SANs; the admin cert is in group
    system:masters. The service-account pair signs and verifies tokens.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = _self_signed_ca(directory, "nodelb-lab-ca")
    san = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{name}" for name in dns_names)])
    apiserver = issue(
        ca,
        directory,
        "apiserver",
        subject="/CN=kube-apiserver",
        extensions=[
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=serverAuth",
            f"subjectAltName={san}",
        ],
    )
    admin = client_cert(ca, directory, "admin", user=admin_name, groups=["system:masters"])
    sa_key = _private_key(directory / "sa.key")
    sa_pub = directory / "sa.pub"
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    return ControlPlanePki(ca=ca, apiserver=apiserver, admin=admin, sa_key=sa_key, sa_pub=sa_pub)


def client_cert(
    ca: CertKey, directory: Path, stem: str, *, user: str, groups: Sequence[str] = ()
) -> CertKey:
    """Return a client cert for Kubernetes user `user` (CN) in `groups` (O), signed by `ca`."""
    subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
    return issue(
        ca,
        directory,
        stem,
        subject=subject,
        extensions=[
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=clientAuth",
        ],
    )


def issue(
    ca: CertKey, directory: Path, stem: str, *, subject: str, extensions: Sequence[str]
) -> CertKey:
    """Return `<stem>.crt`/`<stem>.key` in `directory`: a new key and a cert signed by `ca`."""
    key = _private_key(directory / f"{stem}.key")
    csr = directory / f"{stem}.csr"
    ext = directory / f"{stem}.ext"
    cert = directory / f"{stem}.crt"
    ext.write_text("\n".join(extensions) + "\n")
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-set_serial", _serial(), "-days", str(DAYS), "-sha256",
        "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    return CertKey(cert=cert, key=key)


def _self_signed_ca(directory: Path, name: str) -> CertKey:
    key = _private_key(directory / "ca.key")
    cert = directory / "ca.crt"
    _openssl(
        "req", "-x509", "-new", "-key", str(key), "-subj", f"/CN={name}",
        "-days", str(DAYS), "-sha256", "-out", str(cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip
    return CertKey(cert=cert, key=key)


def _private_key(path: Path) -> Path:
    path.touch(mode=0o600, exist_ok=False)
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )
    return path


def _serial() -> str:
    return hex(secrets.randbits(120) | 1)


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PkiError(f"openssl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
