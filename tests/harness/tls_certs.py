"""Certificates for the tests of the agent's TLS endpoint, made with the ``cryptography`` package: a CA, a
server certificate for 127.0.0.1 and localhost, and client certificates, each written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
import pathlib

import bcrypt


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(directory, name, certificate, key):
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = directory / ("%s.crt" % name), directory / ("%s.key" % name)
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def _certificate(subject, issuer_name, public_key, signing_key, ca=False, server=False, addresses=()):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               # Python 3.13's strict verification wants both key identifiers
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()),
                              critical=False))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost")] + [x509.IPAddress(ipaddress.ip_address(address))
                                           for address in ("127.0.0.1",) + tuple(addresses)]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


class TestPki:
    """A CA in ``directory`` and what it signs: ``server`` (cert, key), ``client`` (cert, key), ``ca`` (cert)."""

    __test__ = False

    def __init__(self, directory, name="test"):
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._ca_key = _key()
        self._ca_name = "%s CA" % name
        ca = _certificate(self._ca_name, self._ca_name, self._ca_key.public_key(), self._ca_key, ca=True)
        self.ca, self._ca_key_path = _write(self.directory, "%s-ca" % name, ca, self._ca_key)
        self.server = self.issue("%s-server" % name, server=True)
        self.client = self.issue("%s-client" % name)

    def issue(self, name, server=False, addresses=()):
        """A (cert, key) pair signed by the CA; a server's names localhost, 127.0.0.1 and ``addresses``."""
        key = _key()
        return _write(self.directory, name, _certificate(name, self._ca_name, key.public_key(), self._ca_key,
                                                         server=server, addresses=addresses), key)


def bcrypt_hash(password, cost=4):
    """A bcrypt hash of ``password`` (cost 4, the least: tests need not be slow)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
