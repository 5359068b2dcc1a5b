"""The TLS context of the metrics endpoint: a mounted certificate, else a self-signed one.

With neither `cert_file` nor `key_file` given, a P-256 key and a self-signed certificate
(valid a year, for localhost, the loopback addresses, the host name and any specific listen
address) are made in memory at start; the certificate (never the key) is written to
`publish_to`, so a client on the same host (`nodelb status`) can pin it. The key lives only
in the process. A mounted pair is loaded as it is (cert-manager, a cluster CA).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import tempfile
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
DEFAULT_CERT_OUT = "/tmp/nodelb-metrics.crt"  # the agent's; `nodelb status` pins it


def self_signed(names: Iterable[str], *, now: datetime.datetime) -> tuple[bytes, bytes]:
    """Return (certificate PEM, PKCS#8 key PEM) of a fresh self-signed serving certificate.

    `names` are host names or IP addresses for its subjectAltName. It is its own CA
    (basicConstraints CA:TRUE, keyCertSign), so pinning it as a trust anchor verifies.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodelb metrics")])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def server_context(
    *,
    cert_file: Path | None,
    key_file: Path | None,
    publish_to: Path | None,
    hosts: Iterable[str] = (),
) -> ssl.SSLContext:
    """Return a TLS 1.2+ server context: the mounted pair, else a self-signed certificate.

    Raises ValueError when only one of `cert_file` and `key_file` is given, OSError or
    ssl.SSLError when the pair cannot be loaded.
    """
    if (cert_file is None) != (key_file is None):
        raise ValueError("--metrics-cert-file and --metrics-key-file go together")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None and key_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
        return ctx
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *hosts]
    cert, key = self_signed(names, now=datetime.datetime.now(datetime.UTC))
    # load_cert_chain reads files: the key goes through a private temporary file, removed
    # at once (no other process can read it: mode 0600 in a fresh file).
    with tempfile.TemporaryDirectory() as d:
        cert_path, key_path = Path(d) / "tls.crt", Path(d) / "tls.key"
        cert_path.write_bytes(cert)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        ctx.load_cert_chain(cert_path, key_path)
    if publish_to is not None:
        tmp = publish_to.with_name(publish_to.name + ".tmp")
        tmp.write_bytes(cert)
        tmp.replace(publish_to)
    return ctx


def client_context(
    *, ca_file: Path | None, pinned: bool = False, insecure: bool = False
) -> ssl.SSLContext:
    """Return the client context of a reader of the endpoint.

    `ca_file` is a CA bundle, verified with the host name; `pinned` says it is the agent's own
    published self-signed certificate: the exact certificate is then the identity, so the
    chain is verified against it and the host name is not checked. `insecure` verifies
    nothing (an explicit choice of the caller).
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    ctx.check_hostname = not pinned
    if ca_file is not None:
        ctx.load_verify_locations(cafile=str(ca_file))
    return ctx
