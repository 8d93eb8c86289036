"""`python -m launcher.agent.linkprobe serve|probe|hold`: one node pair's link, both ways, over one TCP connection,
bounded in bytes and time; each side prints one JSON line. `launcher doctor --links` runs it in short-lived
host-network containers of the image on the two nodes (launcher/host/doctor/link_probes.py); the namespace test runs it
in namespaces. `hold` only listens, accepting and closing connections, for --seconds: doctor's stand-in for Open MPI's
listener (launcher/host/doctor/portcheck.py).

On one connection, the probe (client) side:
1. round trips: PINGS one-byte messages the server echoes; the median is the RTT;
2. forward: it streams zeros for at most LINK_SECONDS (or --seconds) or MAX_BYTES, then half-closes; the server
   times what arrives;
3. the server sends back what it measured (a 4-byte length, then JSON), then streams the same bounded way
   backward; the probe times that.

A rate is timed where the bytes arrive, from the first chunk to the last (the first chunk's bytes left out):
what the link carried, not how fast the sender filled its socket buffer. Stdlib only: it runs in the image and
in a plain venv.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time

from launcher.core.protocol import LINK_SECONDS

PINGS = 21
CHUNK = 1 << 20
IO_TIMEOUT_S = 30.0
"""A peer silent this long ends the test: no container waits for ever."""


def recv_exact(conn: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        data += chunk
    return bytes(data)


def send_for(conn: socket.socket, seconds: float, max_bytes: int) -> int:
    """Streams zeros until `seconds` have passed or `max_bytes` are sent, then half-closes; returns bytes sent."""
    block = memoryview(bytes(CHUNK))
    sent, started = 0, time.perf_counter()
    while sent < max_bytes and time.perf_counter() - started < seconds:
        size = min(CHUNK, max_bytes - sent)
        conn.sendall(block[:size])
        sent += size
    conn.shutdown(socket.SHUT_WR)
    return sent


def receive_all(conn: socket.socket) -> dict[str, float]:
    """Reads until the other end half-closes; {"bytes", "seconds", "mbit"} timed from the first chunk to the
    last (mbit 0 when everything came in one chunk: too little to time)."""
    buffer = bytearray(CHUNK)
    total, first, first_at, last_at = 0, 0, 0.0, 0.0
    while True:
        count = conn.recv_into(buffer)
        if not count:
            break
        last_at = time.perf_counter()
        if not total:
            first, first_at = count, last_at
        total += count
    seconds = last_at - first_at
    return {"bytes": total, "seconds": seconds, "mbit": (total - first) * 8 / seconds / 1e6 if seconds > 0 else 0.0}


def tuned(conn: socket.socket) -> socket.socket:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.settimeout(IO_TIMEOUT_S)
    return conn


def serve(bind: str, port: int, seconds: float, max_bytes: int, accept_timeout: float) -> dict:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(1)
        listener.settimeout(accept_timeout)
        print(json.dumps({"listening": f"{bind}:{port}"}), flush=True)
        conn, peer = listener.accept()
    with tuned(conn):
        for _ in range(PINGS):
            conn.sendall(recv_exact(conn, 1))
        forward = receive_all(conn)
        report = json.dumps(forward).encode()
        conn.sendall(struct.pack("!I", len(report)) + report)
        sent = send_for(conn, seconds, max_bytes)
        conn.recv(1)  # the probe closes once it has read everything
    return {"peer": peer[0], "forward": forward, "backward_sent": sent}


def hold(bind: str, port: int, seconds: float) -> dict:
    """Listens on bind:port for `seconds`, closing each connection at once; returns the peers, in order."""
    peers = []
    deadline = time.monotonic() + seconds
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(16)
        print(json.dumps({"listening": f"{bind}:{port}"}), flush=True)
        while (left := deadline - time.monotonic()) > 0:
            listener.settimeout(left)
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                break
            conn.close()
            peers.append(peer[0])
    return {"peers": peers}


def probe(target: str, port: int, source: str | None, seconds: float, max_bytes: int, connect_timeout: float) -> dict:
    conn = socket.create_connection(
        (target, port), timeout=connect_timeout, source_address=(source, 0) if source else None
    )
    address, local = conn.getpeername()[0], conn.getsockname()[0]
    with tuned(conn):
        rtts = []
        for _ in range(PINGS):
            started = time.perf_counter()
            conn.sendall(b"x")
            recv_exact(conn, 1)
            rtts.append(time.perf_counter() - started)
        sent = send_for(conn, seconds, max_bytes)
        (length,) = struct.unpack("!I", recv_exact(conn, 4))
        forward = json.loads(recv_exact(conn, length))
        backward = receive_all(conn)
        return {
            "address": address,
            "source": local,
            "rtt_ms": statistics.median(rtts[1:]) * 1e3,  # the first round trip also warms the connection up
            "forward_sent": sent,
            "forward": forward,
            "backward": backward,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.agent.linkprobe", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("serve", "probe", "hold"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="0.0.0.0", help="serve: the address to listen on")
    parser.add_argument("--target", help="probe: the server's address or name")
    parser.add_argument("--source", help="probe: the local address to send from (the job's NIC)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=LINK_SECONDS,
        help="the longest each direction streams; hold: how long it listens",
    )
    parser.add_argument("--max-bytes", type=int, default=4 << 30, help="the most each direction streams")
    parser.add_argument("--timeout", type=float, default=10.0, help="serve: accept; probe: connect (seconds)")
    args = parser.parse_args(argv)
    try:
        if args.role == "hold":
            result = hold(args.bind, args.port, args.seconds)
        elif args.role == "serve":
            result = serve(args.bind, args.port, args.seconds, args.max_bytes, args.timeout)
        else:
            result = probe(args.target, args.port, args.source, args.seconds, args.max_bytes, args.timeout)
    except (OSError, ValueError) as error:
        why = "timed out" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
        print(json.dumps({"error": why}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
