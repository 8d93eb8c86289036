"""A TLS engine on this machine, for the launcher's tests: throwaway certificates made with the openssl command, and
a front that listens on a loopback TCP port and forwards each connection to this machine's Docker socket, over TLS
that requires a client certificate of its CA (as `dockerd --tlsverify` does), or in plain HTTP.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

ADDRESS = "127.0.0.2"
"""Where fronts listen: loopback, never an address another machine could reach."""


def engine_socket() -> str:
    """This machine's engine's socket (DOCKER_HOST where it is a unix:// one)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return urlsplit(host).path if host.startswith("unix://") else "/var/run/docker.sock"


def openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, text=True)


def new_key_args(key: str) -> list[str]:
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key]


def make_ca(folder: Path, name: str) -> Path:
    """A CA: ca.pem and ca-key.pem in `folder`."""
    folder.mkdir(parents=True)
    openssl(folder, "req", "-x509", *new_key_args("ca-key.pem"), "-out", "ca.pem", "-days", "1", "-subj", f"/CN={name}")
    return folder


def issue(ca: Path, folder: Path, name: str, extensions: str, trusted_ca: Path | None = None) -> Path:
    """A certificate of `ca` in a Docker CLI certificate folder: cert.pem, key.pem, and ca.pem (trusted_ca's, default
    `ca`'s: the CA the holder checks the other side against)."""
    folder.mkdir(parents=True)
    (folder / "extensions.cnf").write_text(extensions + "\n")
    openssl(folder, "req", *new_key_args("key.pem"), "-out", "request.csr", "-subj", f"/CN={name}")
    openssl(
        folder,
        "x509",
        "-req",
        "-in",
        "request.csr",
        "-CA",
        str(ca / "ca.pem"),
        "-CAkey",
        str(ca / "ca-key.pem"),
        "-set_serial",
        "1",
        "-days",
        "1",
        "-out",
        "cert.pem",
        "-extfile",
        "extensions.cnf",
    )
    (folder / "ca.pem").write_bytes(((trusted_ca or ca) / "ca.pem").read_bytes())
    return folder


def server_context(server: Path) -> ssl.SSLContext:
    """TLS as `dockerd --tlsverify` has it: its own certificate, and a client certificate of its CA required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server / "cert.pem", server / "key.pem")
    context.load_verify_locations(server / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    return context


class EngineFront(threading.Thread):
    """Listens on ADDRESS and forwards every connection to the engine's socket, through TLS (`context`) or plain."""

    def __init__(self, context: ssl.SSLContext | None, target: str | None = None) -> None:
        super().__init__(name="engine-front", daemon=True)
        self.context, self.target = context, target or engine_socket()
        self.listener = socket.create_server((ADDRESS, 0))
        self.port = self.listener.getsockname()[1]
        self.refused: list[str] = []
        """The TLS handshakes the front refused, in OpenSSL's words."""

    @property
    def url(self) -> str:
        return f"tcp://{ADDRESS}:{self.port}"

    def __enter__(self) -> EngineFront:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.listener.close()

    def run(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self.serve, args=(client,), daemon=True).start()

    def serve(self, client: socket.socket) -> None:
        if self.context is not None:
            client = self.context.wrap_socket(client, server_side=True, do_handshake_on_connect=False)
            try:
                client.do_handshake()
            except (ssl.SSLError, OSError) as error:
                self.refused.append(str(error))
                time.sleep(0.5)  # the client reads the TLS alert before the connection closes (not a reset)
                client.close()
                return
        engine = socket.socket(socket.AF_UNIX)
        engine.connect(self.target)
        threading.Thread(target=pump, args=(engine, client), daemon=True).start()
        pump(client, engine)


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            try:
                sock.close()
            except OSError:
                pass
