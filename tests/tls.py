"""A certificate authority made by the test suite, and certificates it signs (Python's
``cryptography``): PEM files, keys in PKCS#8 as Kafka's Java PEM store reads them.

Each principal's certificate has ``CN=<name>``; a secured broker maps it to ``User:<name>``
(``ssl.principal.mapping.rules``), the same principal as the SASL user of that name.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as files."""

    name: str
    certfile: Path
    keyfile: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class Authority:
    """A certificate authority of the test's own, its certificate in ``<folder>/<name>.pem``."""

    def __init__(self, folder: Path, name: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.certfile = folder / f"{name}.pem"
        self.certfile.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    @property
    def pem(self) -> str:
        return self.certfile.read_text()

    def issue(
        self,
        name: str,
        *,
        hosts: tuple[str, ...] = (),
        key_password: str | None = None,
    ) -> Issued:
        """A certificate ``CN=<name>`` for a client, or a server when ``hosts`` are given
        (names or IP addresses in its subject alternative names)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if hosts:
            alternatives: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    alternatives.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    alternatives.append(x509.DNSName(host))
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternatives), critical=False
            )
        certificate = builder.sign(self.key, hashes.SHA256())
        encryption: serialization.KeySerializationEncryption = (
            serialization.NoEncryption()
            if key_password is None
            else serialization.BestAvailableEncryption(key_password.encode())
        )
        certfile = self.folder / f"{name}.crt.pem"
        keyfile = self.folder / f"{name}.key.pem"
        certfile.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        keyfile.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
            )
        )
        keyfile.chmod(0o600)
        return Issued(name, certfile, keyfile)
