"""A stranger against one rank's elastic notification service (the runner's HMAC-signed service), for the rendezvous
tests: it sends the two lengths that made the unpatched service read without end or allocate 1 GiB (-1, then 1 GiB)
and notes whether each connection was closed at once, then opens COUNT connections and holds them idle for
HOLD_SECONDS before closing them. Prints one JSON object: {"closed_at_once": [bool, bool], "held": COUNT, "seconds":
how long opening them took}.

    python notification_flood.py ADDRESS PORT COUNT HOLD_SECONDS
"""

import json
import socket
import struct
import sys
import time

DIGEST_LENGTH = 32  # the runner's HMAC-SHA256 digest, sent ahead of the length


def closed_at_once(address: str, port: int, length: int) -> bool:
    with socket.create_connection((address, port), timeout=5) as connection:
        connection.sendall(b"\0" * DIGEST_LENGTH + struct.pack("i", length))
        connection.settimeout(3)
        try:
            return connection.recv(1) == b""
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True


def main() -> None:
    address, port, count, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    refused = [closed_at_once(address, port, length) for length in (-1, 1 << 30)]
    started, held = time.monotonic(), []
    for _ in range(count):
        held.append(socket.create_connection((address, port), timeout=10))
    opened = time.monotonic() - started
    print(json.dumps({"closed_at_once": refused, "held": len(held), "seconds": round(opened, 1)}), flush=True)
    time.sleep(hold)
    for connection in held:
        connection.close()


if __name__ == "__main__":
    main()
