"""A throwaway certificate authority for one machine's mesh (`recmesh up`, tests, benches).

Every mesh identity gets one certificate, used both to serve and to call:
- a URI SAN `spiffe://<trust domain>/<name>`: who the holder is, what a
  server's peer check reads (recmesh.security);
- a DNS SAN `<name>`: what a client checks the server against, whatever
  address it dialled (clients override the TLS target name with it), plus
  `localhost` and 127.0.0.1 for tools that dial by address.

Keys are ECDSA P-256 (a key in ~1 ms; an RSA-2048 key takes ~50-100 ms),
certificates last `days` (a local CA is made again by every `recmesh up`).
In production the same shapes come from cert-manager (deploy/k8s/base/tls.yaml).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_TRUST_DOMAIN = "recmesh.local"


def spiffe_id(name: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> str:
    return f"spiffe://{trust_domain}/{name}"


@dataclass(frozen=True)
class Issued:
    """PEM bytes of one certificate and its private key."""

    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class CertificateAuthority:
    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self._key = key
        self.cert = cert

    @classmethod
    def create(cls, common_name: str = "recmesh local CA", days: int = 30) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        name: str,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
        dns_names: Iterable[str] = (),
        days: int = 30,
        uri: str | None = None,
        with_identity: bool = True,
    ) -> Issued:
        """A certificate for identity `name` (URI SAN spiffe://trust_domain/name,
        or `uri`; none without `with_identity`; DNS SANs name, localhost and
        `dns_names`; IP SAN 127.0.0.1), valid for serving and for calling."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        dns = list(dict.fromkeys([name, "localhost", *dns_names]))
        sans: list[x509.GeneralName] = []
        if with_identity:
            sans.append(x509.UniformResourceIdentifier(uri or spiffe_id(name, trust_domain)))
        sans += [x509.DNSName(d) for d in dns]
        sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write atomically; a private key is readable by its owner only."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class IdentityFiles:
    """Where one identity's certificate, key and the CA lie."""

    name: str
    ca: Path
    cert: Path
    key: Path

    def env(self) -> dict[str, str]:
        """The variables a process reads them from (recmesh.security.TlsSettings)."""
        return {
            "RECMESH_TLS_CA": str(self.ca),
            "RECMESH_TLS_CERT": str(self.cert),
            "RECMESH_TLS_KEY": str(self.key),
        }


def write_local_pki(
    directory: Path, names: Sequence[str], trust_domain: str = DEFAULT_TRUST_DOMAIN, days: int = 30
) -> dict[str, IdentityFiles]:
    """A new CA and one certificate per name under `directory` (ca.crt,
    <name>.crt, <name>.key); the CA's key is never written, so nothing can
    issue another certificate from it once this returns."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca = CertificateAuthority.create(days=days)
    ca_path = directory / "ca.crt"
    _write(ca_path, ca.cert_pem)
    files: dict[str, IdentityFiles] = {}
    for name in names:
        issued = ca.issue(name, trust_domain, days=days)
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        _write(cert, issued.cert_pem)
        _write(key, issued.key_pem, private=True)
        files[name] = IdentityFiles(name, ca_path, cert, key)
    return files
