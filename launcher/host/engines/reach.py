"""Whether a node's engine can be reached at all, asked in bounded time before the Docker SDK connects: docker-py's
ssh transport waits on `ssh ... docker system dial-stdio` with no timeout of its own, so a host that drops every
packet would hang the launcher without a word. An ssh:// engine is asked once with the system ssh client (the
user's ssh config, keys and agent; ConnectTimeout, no prompts), a tcp:// one with a TCP connection; what failed
(the name does not resolve, no answer, no route, refused, the key or the docker group) becomes one line with its
fix, as does a TLS connection the SDK then fails to make (tls_failure). The wording is pure (`ssh_failure`,
`tcp_failure`, `tls_failure`); `probe` is the side effect.
"""

from __future__ import annotations

import errno
import re
import socket
import subprocess
from dataclasses import dataclass
from urllib.parse import urlsplit

from launcher.host.planning.access import CERT_PATH, INSECURE_FLAG, TLS_DOCS, TLS_VERIFY, engine_override_key, node_key

ANSWER_GRACE_S = 30.0
"""How long `docker version` may take over a connection that was made (a busy engine), before it counts as hung."""
TIMEOUT_FIX = "raise CONNECT_TIMEOUT in .env if the link is merely slow"


@dataclass(frozen=True)
class SshTarget:
    """An ssh:// engine address: ssh://[USER@]HOST[:PORT]."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def of(cls, url: str) -> SshTarget:
        parts = urlsplit(url)
        return cls(parts.hostname or "", parts.username, parts.port)

    @property
    def login(self) -> str:
        """How the user would type it: `ssh LOGIN`."""
        return (f"{self.user}@" if self.user else "") + self.host + (f" -p {self.port}" if self.port else "")

    def options(self, connect_timeout: float) -> list[str]:
        """ssh's own options for a launcher connection: bounded, and never a prompt nobody would see."""
        options = ["-o", f"ConnectTimeout={max(1, round(connect_timeout))}", "-o", "BatchMode=yes"]
        options += ["-l", self.user] if self.user else []
        options += ["-p", str(self.port)] if self.port else []
        return options


def ssh_failure(target: SshTarget, stderr: str, connect_timeout: float) -> str:
    """What ssh's (or the remote docker's) complaint means, and its fix, in one line."""
    host, login = target.host, target.login
    said = stderr.lower()
    if "could not resolve hostname" in said:
        return (
            f"{host} does not resolve on this machine; add it to /etc/hosts (`ADDRESS {host}`) or ~/.ssh/config "
            f"(`Host {host}` with `HostName ADDRESS`)"
        )
    if "timed out" in said:
        return (
            f"no answer from {host} within {connect_timeout:g} s (the host is down, or a firewall drops its ssh port); "
            f"check its address and that `ssh {login} docker version` answers, or {TIMEOUT_FIX}"
        )
    if "no route to host" in said or "network is unreachable" in said:
        return (
            f"no route to {host} (down, or on a network this machine cannot reach); check its address and that it is up"
        )
    if "connection refused" in said:
        return f"{host} refuses ssh (no sshd on its port); start sshd there, or give the port: ssh://{host}:PORT"
    if "host key verification failed" in said:
        return f"{host}'s host key is unknown here or has changed; run `ssh {login}` once to check and accept it"
    if "docker daemon socket" in said and "permission denied" in said:
        user = target.user or "USER"
        return (
            f"the ssh user may not use Docker on {host}; add it to the docker group there (`sudo usermod -aG docker "
            f"{user}`, then log in again)"
        )
    if "permission denied" in said:
        return (
            f"{host} refused this machine's ssh key; `ssh-copy-id {login}` installs it, and a key with a passphrase "
            "needs ssh-agent (the launcher's ssh asks nothing)"
        )
    if "command not found" in said or "no such file or directory" in said:
        return f"docker is not installed on {host}, or not on the PATH of a non-interactive ssh session there"
    if "cannot connect to the docker daemon" in said:
        return f"Docker is not running on {host}; start it there (`sudo systemctl start docker`)"
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "no message")
    return f"`ssh {login} docker version` failed ({last[:200]}); run it by hand to see why"


def tcp_failure(host: str, port: int, error: OSError, connect_timeout: float) -> str:
    """What a failed TCP connection to a tcp:// engine means, in one line."""
    if isinstance(error, socket.gaierror):
        return f"{host} does not resolve on this machine; add it to /etc/hosts or use its address"
    if isinstance(error, TimeoutError):
        return (
            f"no answer from {host}:{port} within {connect_timeout:g} s (down, or a firewall drops it); {TIMEOUT_FIX}"
        )
    if isinstance(error, ConnectionRefusedError):
        return f"nothing listens on {host}:{port} (is the engine's TCP socket enabled there?)"
    if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"no route to {host} (down, or on a network this machine cannot reach)"
    return f"{host}:{port}: {error.strerror or error}"


SSL_REASON = re.compile(r"\[(?:SSL|X509)(?:: [A-Z0-9_]+)?\] ([^(\"']+)")
"""OpenSSL's words in a wrapped exception's text: `[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: ...`."""
SSL_MESSAGE = re.compile(r"(?:Error|Exception)\(\d+, ['\"]([^'\"]+?)(?: \(_ssl\.c:\d+\))?['\"]\)")
"""An ssl exception's own message without OpenSSL's code: `SSLEOFError(8, 'EOF occurred in violation of ...')`."""
CLIENT_CERT_REFUSED = (
    "alert unknown ca",
    "alert bad certificate",
    "certificate required",
    "alert certificate unknown",
    "alert access denied",
    "alert decrypt error",
)
"""The alerts an engine sends when it does not accept the client's certificate (Go's crypto/tls, OpenSSL)."""


def tls_failure(node: str, url: str, said: str, folder: str | None) -> str | None:
    """What a failed connection to a tcp:// engine means where TLS is the cause, in one line with its fix; None
    where it is not. `folder`: the certificate folder in use (None: plain TCP, no TLS asked for)."""
    lowered = said.lower()
    verify_key, cert_key, host_key = node_key(TLS_VERIFY, node), node_key(CERT_PATH, node), engine_override_key(node)
    if folder is None:
        if "http request to an https server" in lowered:
            return (
                f"its engine at {url} speaks TLS, but no TLS was asked for: set {verify_key}=1 and {cert_key} (or "
                f"{TLS_VERIFY} and {CERT_PATH} for every node) to the folder with ca.pem, cert.pem and key.pem"
            )
        return None
    found = SSL_REASON.search(said) or SSL_MESSAGE.search(said)
    reason = found.group(1).strip() if found else said.strip().splitlines()[0][:200] if said.strip() else "no reason"
    if "wrong version number" in lowered or "http_request" in lowered or "packet length too long" in lowered:
        return (
            f"its engine at {url} answers in plain HTTP, not TLS ({reason}): start its dockerd with --tlsverify "
            f"({TLS_DOCS}), or set {verify_key}= and {cert_key}= (empty) to reach it without TLS ({INSECURE_FLAG} "
            "off this machine)"
        )
    if "certificate verify failed" in lowered and ("mismatch" in lowered or "not valid for" in lowered):
        return (
            f"its engine's certificate does not name the host in {url} ({reason}): issue it with that name or address "
            f"in subjectAltName, or point {host_key} at a name the certificate holds"
        )
    if "certificate verify failed" in lowered:
        return (
            f"its engine's certificate is not signed by the CA in {folder}/ca.pem ({reason}): put the CA that signed "
            "the engine's --tlscert there"
        )
    if any(alert in lowered for alert in CLIENT_CERT_REFUSED):
        return (
            f"its engine refused this machine's client certificate {folder}/cert.pem ({reason}): use one signed by "
            f"the CA the engine's --tlscacert names (or point {cert_key} at the folder that has one)"
        )
    if "key values mismatch" in lowered:
        return f"{folder}/cert.pem and key.pem are not a pair ({reason}): put the key of that certificate in key.pem"
    if "pem lib" in lowered or "no certificate" in lowered or "no start line" in lowered:
        return f"a file in {folder} is not a PEM certificate or key ({reason}): replace ca.pem, cert.pem, key.pem"
    if "eof occurred" in lowered or "connection reset" in lowered or "connection aborted" in lowered:
        return (
            f"its engine at {url} ended the TLS handshake ({reason}): it did not accept the client certificate "
            f"{folder}/cert.pem (signed by a CA its --tlscacert does not name?), or that port is not its TLS port"
        )
    if "ssl" in lowered or "tls" in lowered:
        return (
            f"the TLS handshake with its engine at {url} failed ({reason}): check the engine's --tlsverify, "
            f"--tlscacert, --tlscert, --tlskey and the files in {folder}"
        )
    return None


def probe(url: str, connect_timeout: float, tls: bool = False) -> str | None:
    """Why the engine at `url` cannot be reached (one line with its fix), within about `connect_timeout` seconds
    (plus ANSWER_GRACE_S for an engine that was reached but does not answer); None if it answers. unix:// and
    other local engines are left to the SDK. `tls`: the engine is reached over TLS (Docker's port 2376 by default)."""
    scheme = urlsplit(url).scheme
    if scheme == "ssh":
        target = SshTarget.of(url)
        argv = [
            "ssh",
            *target.options(connect_timeout),
            "--",
            target.host,
            "docker version --format '{{.Server.Version}}'",
        ]
        try:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=connect_timeout + ANSWER_GRACE_S,
            )
        except subprocess.TimeoutExpired:
            return (
                f"`ssh {target.login} docker version` did not answer within {connect_timeout + ANSWER_GRACE_S:g} s; "
                "run it by hand to see where it waits"
            )
        except FileNotFoundError:
            return (
                "no ssh client on this machine; install OpenSSH's client (the launcher reaches ssh:// engines with it)"
            )
        return ssh_failure(target, result.stderr, connect_timeout) if result.returncode else None
    if scheme in ("tcp", "http", "https"):
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (2376 if scheme == "https" or tls else 2375)
        try:
            socket.create_connection((host, port), timeout=connect_timeout).close()
        except OSError as error:
            return tcp_failure(host, port, error, connect_timeout)
    return None
