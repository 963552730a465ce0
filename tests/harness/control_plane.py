"""A real Kubernetes control plane on 127.0.0.1 for the tests and the demo.

etcd and kube-apiserver are built from the pinned Go module in
tools/control-plane (``tools/control-plane/build``), started with their own
certificate authority, the Node and RBAC authorizers and the NodeRestriction
admission plugin (ValidatingAdmissionPolicy is on by default since 1.30), and
stopped by PID. Kubeconfigs are written for an admin (group system:masters) and,
on demand, for node identities (``system:node:<name>`` in group system:nodes).

    PYTHONPATH=tests python -m harness.control_plane start build/cluster   # what `make cluster` runs
    PYTHONPATH=tests python -m harness.control_plane stop build/cluster    # what `make cluster-stop` runs
    PYTHONPATH=tests python -m harness.control_plane node-kubeconfig build/cluster NODE
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import pathlib
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from harness.common import free_port
from harness.paths import ROOT, SCV_CRD

BUILD_SCRIPT = ROOT / "tools" / "control-plane" / "build"
READY_TIMEOUT = 180


def build_binaries(kubelet=False):
    """The folder holding kube-apiserver, kubectl and etcd (and the kubelet when asked), built once per pin."""
    done = subprocess.run([str(BUILD_SCRIPT)] + (["--kubelet"] if kubelet else []), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError("building the control plane failed:\n%s" % done.stderr[-4000:])
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


def _write_key(path, key):
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name, organization=None):
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def write_kubeconfig(path, server, ca_file, cert, key, user="user", context="scv-test"):
    """Writes a kubeconfig (JSON, mode 0600) for a client certificate against ``server``; returns ``path``."""
    path.write_text(json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "scv-test", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": context, "context": {"cluster": "scv-test", "user": user}}],
        "current-context": context,
    }, indent=2))
    path.chmod(0o600)
    return path


class CertificateAuthority:
    """A CA in ``directory`` (ca.crt, ca.key) that issues server and client certificates."""

    def __init__(self, directory, cert=None, key=None):
        self.directory = directory
        self.cert_path = directory / "ca.crt"
        if cert is not None:
            self.cert, self.key = cert, key
            return
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        name = _name("scv-gpu test control plane CA")
        self.cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / "ca.key", self.key)

    @classmethod
    def load(cls, directory):
        cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        return cls(directory, cert, key)

    def issue(self, stem, common_name, organization=None, server_names=(), lifetime=datetime.timedelta(days=7)):
        """Writes <stem>.crt and <stem>.key; returns their paths. The certificate expires ``lifetime`` from now."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder().subject_name(_name(common_name, organization)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # Python 3.13's default TLS context (VERIFY_X509_STRICT) requires both identifiers.
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        if server_names:
            alternatives = []
            for entry in server_names:
                try:
                    alternatives.append(x509.IPAddress(ipaddress.ip_address(entry)))
                except ValueError:
                    alternatives.append(x509.DNSName(entry))
            builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
            usage = x509.ExtendedKeyUsageOID.SERVER_AUTH
        else:
            usage = x509.ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path = self.directory / ("%s.crt" % stem)
        key_path = self.directory / ("%s.key" % stem)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return cert_path, key_path


class ControlPlane:
    """etcd + kube-apiserver under ``directory``; ``state.json`` there records their PIDs."""

    def __init__(self, directory, apiserver_args=(), ready_excludes=()):
        self.directory = pathlib.Path(directory).resolve()
        self.state_path = self.directory / "state.json"
        self.state = {}
        self.apiserver_args = list(apiserver_args)   # more flags for kube-apiserver (an audit log)
        # readyz checks not waited for: with resource.k8s.io/v1 turned off, informer-sync never passes (the
        # Node authorizer watches ResourceSlices), though the server serves everything else
        self.ready_excludes = list(ready_excludes)

    # ---------------------------------------------------------------- start

    def start(self):
        if self.state_path.exists():
            raise RuntimeError("%s exists: a control plane may still run there; stop it first "
                               "(PYTHONPATH=tests python -m harness.control_plane stop %s)" % (self.state_path, self.directory))
        binaries = build_binaries()
        shutil.rmtree(self.directory, ignore_errors=True)
        pki = self.directory / "pki"
        pki.mkdir(parents=True)
        ca = CertificateAuthority(pki)
        server_cert, server_key = ca.issue("kube-apiserver", "kube-apiserver", server_names=(
            "127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "10.0.0.1"))
        service_account_key = ec.generate_private_key(ec.SECP256R1())
        _write_key(pki / "service-account.key", service_account_key)
        (pki / "service-account.pub").write_bytes(service_account_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

        etcd_port, peer_port, api_port, etcd_metrics_port = free_port(), free_port(), free_port(), free_port()
        # The CA key stays in pki/ so that node identities can be issued later, by other processes too.
        self.state = {
            "pids": {},
            "bin": str(binaries),
            "server": "https://127.0.0.1:%d" % api_port,
            "ca": str(ca.cert_path),
            "etcd_metrics": "http://127.0.0.1:%d/metrics" % etcd_metrics_port,
        }
        self._save()
        try:
            self._spawn("etcd", [
                str(binaries / "etcd"),
                "--name", "scv-test",
                "--data-dir", str(self.directory / "etcd-data"),
                "--listen-client-urls", "http://127.0.0.1:%d" % etcd_port,
                "--advertise-client-urls", "http://127.0.0.1:%d" % etcd_port,
                "--listen-peer-urls", "http://127.0.0.1:%d" % peer_port,
                "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer_port,
                "--initial-cluster", "scv-test=http://127.0.0.1:%d" % peer_port,
                "--listen-metrics-urls", "http://127.0.0.1:%d" % etcd_metrics_port,
                "--log-level", "warn",
            ])
            self._spawn("kube-apiserver", [
                str(binaries / "kube-apiserver"),
                "--etcd-servers", "http://127.0.0.1:%d" % etcd_port,
                "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1",
                # A loopback address cannot back the in-cluster "kubernetes" Service; nothing here uses it.
                "--endpoint-reconciler-type=none",
                "--secure-port", str(api_port),
                "--cert-dir", str(self.directory / "apiserver-certs"),
                "--tls-cert-file", str(server_cert),
                "--tls-private-key-file", str(server_key),
                "--client-ca-file", str(ca.cert_path),
                "--authorization-mode", "Node,RBAC",
                "--enable-admission-plugins", "NodeRestriction",
                "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file", str(pki / "service-account.pub"),
                "--service-account-signing-key-file", str(pki / "service-account.key"),
                "--service-cluster-ip-range", "10.0.0.0/24",
                "--allow-privileged=true",
                "--profiling=false",
                "--v", "1",
            ] + self.apiserver_args)
            self.state["admin_kubeconfig"] = str(self.kubeconfig("admin", "scv-test-admin", "system:masters"))
            self._save()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name, command):
        log = open(self.directory / ("%s.log" % name), "ab")  # pylint: disable=consider-using-with
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        log.close()
        self.state["pids"][name] = process.pid
        self.state.setdefault("commands", {})[name] = command
        self._save()

    def stop_apiserver(self):
        """Stops kube-apiserver alone (etcd keeps the data), as an outage would."""
        terminate_group(self.state["pids"].pop("kube-apiserver"))
        self._save()

    def start_apiserver(self):
        """Starts kube-apiserver again with the same flags and waits until it is ready."""
        self._spawn("kube-apiserver", self.state["commands"]["kube-apiserver"])
        self._wait_ready()

    def _save(self):
        self.state_path.write_text(json.dumps(self.state, indent=2))

    def _wait_ready(self):
        admin = self.directory / "pki" / "admin"
        context = ssl.create_default_context(cafile=self.state["ca"])
        context.load_cert_chain("%s.crt" % admin, "%s.key" % admin)
        deadline = time.monotonic() + READY_TIMEOUT
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, pid in self.state["pids"].items():
                if not _alive(pid):
                    raise RuntimeError("%s exited while starting; see %s" % (
                        name, self.directory / ("%s.log" % name)))
            try:
                query = "".join("&exclude=%s" % name for name in self.ready_excludes).replace("&", "?", 1)
                with urllib.request.urlopen(self.state["server"] + "/readyz" + query, context=context,
                                            timeout=5) as answer:
                    if answer.status == 200:
                        return
            except urllib.error.HTTPError as error:
                last = "HTTP %d" % error.code
            except urllib.error.URLError as error:
                if isinstance(error.reason, ssl.SSLCertVerificationError):
                    raise RuntimeError("kube-apiserver's certificate does not verify: %s" % error.reason) from error
                last = str(error)
            except OSError as error:
                last = str(error)
            time.sleep(0.5)
        raise RuntimeError("kube-apiserver not ready after %d s (%s); see %s" % (
            READY_TIMEOUT, last, self.directory / "kube-apiserver.log"))

    # ----------------------------------------------------------- identities

    @classmethod
    def attach(cls, directory):
        """The control plane a `start` in another process left running in ``directory``."""
        plane = cls(directory)
        plane.state = json.loads(plane.state_path.read_text())
        return plane

    @property
    def server(self):
        return self.state["server"]

    @property
    def admin_kubeconfig(self):
        return pathlib.Path(self.state["admin_kubeconfig"])

    def kubeconfig(self, stem, user, group=None):
        """Writes ``<stem>.kubeconfig`` for a client certificate identity; returns its path."""
        pki = self.directory / "pki"
        path = self.directory / ("%s.kubeconfig" % stem)
        if path.exists():
            return path
        cert, key = CertificateAuthority.load(pki).issue(stem, user, group)
        return write_kubeconfig(path, self.server, self.state["ca"], cert, key, user=user, context=stem)

    def node_kubeconfig(self, node):
        """A kubeconfig for the kubelet identity of ``node`` (system:node:<node>, group system:nodes)."""
        return self.kubeconfig("node-%s" % node, "system:node:%s" % node, "system:nodes")

    def kubectl(self, *arguments, kubeconfig=None, check=True, input_text=None):
        command = [str(pathlib.Path(self.state["bin"]) / "kubectl"),
                   "--kubeconfig", str(kubeconfig or self.admin_kubeconfig)] + list(arguments)
        done = subprocess.run(command, capture_output=True, text=True, check=False, input=input_text)
        if check and done.returncode != 0:
            raise RuntimeError("kubectl %s failed (%d): %s" % (" ".join(arguments), done.returncode, done.stderr))
        return done

    # ----------------------------------------------------------------- stop

    def stop(self):
        """Stops what start() started, by PID, apiserver first; safe to call twice."""
        pids = self.state.get("pids", {})
        for name in ("kube-apiserver", "etcd"):
            pid = pids.get(name)
            if pid:
                terminate_group(pid)
        self.state["pids"] = {}
        if self.state_path.exists():
            self.state_path.unlink()


def install_scv_crd(plane):
    """Applies the Scv CRD to a running control plane and waits until it is served."""
    plane.kubectl("apply", "-f", str(SCV_CRD))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/scvs.core.run-linux.com")


def read_object(plane, kind, name, namespace=None, managed_fields=False, missing_ok=False):
    """One object as the API server holds it (``kubectl get -o json``); RuntimeError when it cannot be read.

    ``missing_ok``: None when the API server answers that there is no such object.
    """
    arguments = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
    if managed_fields:
        arguments.append("--show-managed-fields")
    done = plane.kubectl(*arguments, check=False)
    if done.returncode == 0:
        return json.loads(done.stdout)
    if missing_ok and "(NotFound)" in done.stderr:
        return None
    raise RuntimeError("kubectl %s failed (%d): %s" % (" ".join(arguments), done.returncode, done.stderr))


def _alive(pid):
    try:
        finished, _status = os.waitpid(pid, os.WNOHANG)
        if finished:
            return False
    except ChildProcessError:
        pass  # not our child (started by another process): ask the kernel instead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def terminate_group(pid, grace=15):
    """Stops the process group that ``pid`` leads (started with a session of its own): SIGTERM, SIGKILL after ``grace`` s."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while _alive(pid):
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser(description="Start or stop the test control plane, or issue a node's kubeconfig.")
    parser.add_argument("action", choices=("start", "stop", "node-kubeconfig"))
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("node", nargs="?", help="node-kubeconfig: the node whose kubelet identity to issue")
    args = parser.parse_args()
    if args.action == "node-kubeconfig":
        print(ControlPlane.attach(args.directory).node_kubeconfig(args.node))
        return 0
    if args.action == "start":
        plane = ControlPlane(args.directory).start()
        print("kube-apiserver ready at %s" % plane.server)
        print("admin kubeconfig: %s" % plane.admin_kubeconfig)
    else:
        if not (args.directory / "state.json").exists():
            print("no control plane recorded in %s" % args.directory)
            return 0
        ControlPlane.attach(args.directory).stop()
        print("stopped the control plane in %s" % args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
