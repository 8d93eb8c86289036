"""The elastic job's rendezvous closed to strangers (docker/horovod-runner/stack_guard.py, patched into Horovod's
runner): the rules as a table, the restricted loaders against a pickle that runs code, and the patched rendezvous
server itself on loopback, as horovodrun starts it for an elastic job. The same on real hosts, against every port
of rank 0's node during a job: tests/test_rendezvous_on_test_hosts.py and the compose elastic test."""

from __future__ import annotations

import base64
import http.client
import importlib.util
import os
import pickle
import socket
import struct
import time
from pathlib import Path

import pytest

from tests.extras import skip_module_without

skip_module_without("cloudpickle")  # one of Horovod's dependencies

import cloudpickle  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKEN = "the-jobs-secret"


def load_guard():
    found = importlib.util.spec_from_file_location("stack_guard", REPO / "docker" / "horovod-runner" / "stack_guard.py")
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


guard = load_guard()


class RunsCode:
    """Unpickled, it would create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize(
    ("method", "path", "headers", "why"),
    [
        ("PUT", "/worker_addresses/node_2:0", {"Authorization": f"Bearer {TOKEN}", "Content-Length": "120"}, None),
        ("GET", "/rank_and_size/node_2:0", {"Authorization": f"Bearer {TOKEN}"}, None),
        ("GET", "/global/0", {"Authorization": f"Bearer {TOKEN}"}, None),
        ("DELETE", "/global/0", {"Authorization": f"Bearer {TOKEN}"}, None),
        ("PUT", "/worker_addresses/node_2:0", {"Content-Length": "120"}, "no job secret"),
        ("PUT", "/worker_addresses/node_2:0", {"Authorization": "Bearer guessed"}, "a wrong job secret"),
        ("PUT", "/worker_addresses/node_2:0", {"Authorization": TOKEN}, "a wrong job secret"),
        (
            "GET",
            "/worker_addresses/node_2:0",
            {"Authorization": f"Bearer {TOKEN}"},
            "the worker_addresses scope is not readable",
        ),
        (
            "PUT",
            "/global/0",
            {"Authorization": f"Bearer {TOKEN}", "Content-Length": str(2 << 20)},
            "a body of '2097152' bytes (at most 1048576)",
        ),
        (
            "PUT",
            "/global/0",
            {"Authorization": f"Bearer {TOKEN}", "Content-Length": "-1"},
            "a body of '-1' bytes (at most 1048576)",
        ),
    ],
)
def test_which_requests_the_rendezvous_refuses(method, path, headers, why):
    assert guard.refusal(method, path, headers, TOKEN) == why


def test_a_server_without_a_job_secret_refuses_everything():
    why = guard.refusal("GET", "/global/0", {"Authorization": "Bearer "}, None)
    assert why.startswith("this server has no job secret (HOROVOD_STACK_RENDEZVOUS_TOKEN unset)")


def test_the_plain_loader_builds_what_a_rank_sends_and_nothing_that_runs_code(tmp_path):
    """A rank's PUT carries ({NIC: [(address, port)]}, key); a stranger's carries a pickle that runs a command."""
    sent = ({"eth0": [("10.0.0.12", 40123)]}, b"\x01" * 32)
    assert guard.loads_plain_base64(base64.b64encode(cloudpickle.dumps(sent))) == sent
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError, match="refused to load posix.system from the network: plain data only"):
        guard.loads_plain(pickle.dumps((RunsCode(marker), b"key")))
    assert not marker.exists()


class GetattrOf:
    """How Python 3.11.2 (Debian 12's, the image's) pickles an IntFlag member: getattr(HostUpdateResult, 'added')."""

    def __reduce__(self):
        from horovod.runner.elastic.worker import HostUpdateResult

        return getattr, (HostUpdateResult, "added")


def test_the_message_loader_builds_the_runners_messages_only(tmp_path):
    """The runner's HMAC-signed services (a rank's notification service) take their own records, nothing else: not
    a command, not a class of the runner's that is no message, not getattr (which reaches any attribute)."""
    from horovod.runner.common.util.network import BasicClient, PingRequest
    from horovod.runner.elastic.worker import HostsUpdatedRequest

    request = guard.loads_message(cloudpickle.dumps(HostsUpdatedRequest(12.5, 2)))
    assert (request.timestamp, request.res) == (12.5, 2)
    assert isinstance(guard.loads_message(cloudpickle.dumps(PingRequest())), PingRequest)
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError, match="refused to load posix.system from the network: not a message"):
        guard.loads_message(pickle.dumps(RunsCode(marker)))
    with pytest.raises(pickle.UnpicklingError, match="horovod.runner.common.util.network.BasicClient"):
        guard.loads_message(cloudpickle.dumps(BasicClient))  # a class of the runner's that is not a message
    with pytest.raises(pickle.UnpicklingError, match="refused to load builtins.getattr"):
        guard.loads_message(pickle.dumps(GetattrOf()))
    assert not marker.exists()


def short_string(text: str) -> bytes:
    return pickle.SHORT_BINUNICODE + bytes([len(text)]) + text.encode()


def global_of(module: str, name: str) -> bytes:
    """Protocol 4's way to name a class, whose dotted names walk attributes from the module."""
    return b"\x80\x04" + short_string(module) + short_string(name) + pickle.STACK_GLOBAL


DOTTED = (
    global_of(
        "horovod.runner.common.util.network",
        "cloudpickle.dataclasses.inspect.importlib.metadata.email.utils.urllib.request.Request",
    )
    + pickle.EMPTY_TUPLE
    + pickle.REDUCE
    + pickle.STOP
)
"""A name that ends in Request, from a module of the runner's messages, that reaches urllib.request.Request through
the module's imports (the earlier rule, a suffix and a module, built it)."""
ON_A_CLASS = (
    global_of("horovod.runner.common.util.network", "PingRequest")
    + pickle.NONE
    + pickle.EMPTY_DICT
    + short_string("stolen")
    + pickle.BININT1
    + b"\x01"
    + pickle.SETITEM
    + pickle.TUPLE2
    + pickle.BUILD
    + pickle.STOP
)
"""An admitted class itself, then BUILD with a slot state: setattr(PingRequest, 'stolen', 1) for the process."""


def test_the_message_loader_admits_exact_names_and_builds_no_class():
    from horovod.runner.common.util.network import PingRequest

    with pytest.raises(pickle.UnpicklingError, match="network.cloudpickle.dataclasses.*: not a message"):
        guard.loads_message(DOTTED)
    with pytest.raises(pickle.UnpicklingError, match="refused to set attributes on the class PingRequest"):
        guard.loads_message(ON_A_CLASS)
    assert not hasattr(PingRequest, "stolen")
    assert pickle.loads(ON_A_CLASS) is PingRequest and PingRequest.stolen == 1  # what the payload does unguarded
    del PingRequest.stolen


def test_every_admitted_message_is_a_class_the_runner_defines_there():
    """The table names real classes (a renamed one would make its service refuse its own messages), each defined in
    the module it is listed under, as pickle names it."""
    import importlib

    for module, names in guard.MESSAGES.items():
        for name in names:
            found = getattr(importlib.import_module(module), name)
            assert isinstance(found, type) and found.__module__ == module, (module, name)


def test_a_refusal_is_told_once_a_minute_per_address_and_says_how_many_went_untold():
    refusals = guard.RefusalLog()
    told = [
        (address, at, refusals.untold_before(address, at))
        for address, at in [("10.0.0.9", 100.0), ("10.0.0.9", 105.0), ("10.0.0.7", 106.0), ("10.0.0.9", 159.0),
                            ("10.0.0.9", 160.0), ("10.0.0.9", 230.0)]
    ]  # fmt: skip
    assert told == [
        ("10.0.0.9", 100.0, 0),
        ("10.0.0.9", 105.0, None),
        ("10.0.0.7", 106.0, 0),  # another address: its own minute
        ("10.0.0.9", 159.0, None),
        ("10.0.0.9", 160.0, 2),
        ("10.0.0.9", 230.0, 0),
    ]


def test_the_agents_stall_watch_knows_a_refusal_line_for_no_progress():
    """The line stack_guard writes, as the job agent's stall watch reads it (launcher/core/stall.py)."""
    from launcher.core import stall

    assert guard.REFUSAL_LINE == stall.REFUSAL_MARK
    line = guard.REFUSAL_LINE + "10.0.0.9 (PUT '/x'): no job secret"
    assert not stall.is_progress(line) and stall.is_progress("[1]<stdout>:epoch 1/5")


def test_a_host_update_reaches_a_ranks_notification_service(monkeypatch):
    """The patched runner's own round trip, as horovodrun's driver tells rank 0 that a host came back: the client
    sends the flag as a plain int, the service hands the rank a HostUpdateResult (Python 3.11.2 would have pickled
    the enum member through getattr, which the loader refuses)."""
    from horovod.runner.common.util import secret
    from horovod.runner.elastic.worker import HostUpdateResult, WorkerNotificationClient, WorkerNotificationService

    class Manager:
        updates: list = []

        def handle_hosts_updated(self, timestamp, update_res):
            self.updates.append((timestamp, update_res))

    key, manager = secret.make_secret_key(), Manager()
    service = WorkerNotificationService(key, "lo", manager)
    try:
        assert service.addresses() == {"lo": [("127.0.0.1", service.get_port())]}
        WorkerNotificationClient(service.addresses(), key, verbose=0).notify_hosts_updated(7.0, HostUpdateResult.added)
    finally:
        service.shutdown()
    assert manager.updates == [(7.0, HostUpdateResult.added)]
    assert isinstance(manager.updates[0][1], HostUpdateResult)


def closed_by_the_server(connection: socket.socket, within: float = 10.0) -> bool:
    """Whether the server closed the connection (EOF) before `within` seconds passed with nothing."""
    connection.settimeout(within)
    try:
        return connection.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


STRANGERS_CONNECTIONS = 2000


def test_a_ranks_notification_service_holds_a_stranger_to_bounded_memory_and_threads(monkeypatch):
    """Before its HMAC can be checked the service reads a length: -1 was "read until the connection closes" and 1 GiB
    a buffer of that size, each with no timeout, and each connection a thread. Now: both refused unread (closed at
    once), an idle connection closed after the idle time (2 s here), and 2,000 idle connections held open cost at
    most MAX_CONNECTIONS threads (the others are closed by the accepting thread) and less than 16 MiB; afterwards
    the driver's host update still reaches the rank. (With socketserver's own listen queue of 5, a burst like this
    one took 325 s to connect: the kernel dropped the connections that found the queue full, and each waited out its
    retry; BACKLOG makes it seconds.)"""
    import threading

    import psutil
    from horovod.runner.common.util import secret, stack_guard
    from horovod.runner.elastic.worker import HostUpdateResult, WorkerNotificationClient, WorkerNotificationService

    class Manager:
        updates: list = []

        def handle_hosts_updated(self, timestamp, update_res):
            self.updates.append((timestamp, update_res))

    key, manager = secret.make_secret_key(), Manager()
    monkeypatch.setattr(stack_guard, "IDLE_SECONDS", 2.0)
    quick = WorkerNotificationService(key, "lo", manager)  # its connections idle 2 s at most
    monkeypatch.undo()
    service = WorkerNotificationService(key, "lo", manager)  # as a rank has it (IDLE_SECONDS, 30 s)
    this = psutil.Process()
    threads, memory = threading.active_count(), this.memory_info().rss
    held: list[socket.socket] = []
    try:
        for length in (-1, 1 << 30):
            with socket.create_connection(("127.0.0.1", quick.get_port())) as connection:
                connection.sendall(b"\0" * secret.DIGEST_LENGTH + struct.pack("i", length))
                assert closed_by_the_server(connection, within=1.5), f"a length of {length} was not refused at once"
        with socket.create_connection(("127.0.0.1", quick.get_port())) as idle:
            assert closed_by_the_server(idle, within=10), "an idle connection was not closed"
        peak_threads = 0
        for _ in range(STRANGERS_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", service.get_port())))
            peak_threads = max(peak_threads, threading.active_count() - threads)
        grown = this.memory_info().rss - memory
        print(f"{STRANGERS_CONNECTIONS} idle connections held to a rank's notification service: "
              f"at most {peak_threads} more threads, {grown / 2**20:.1f} MiB more memory")  # fmt: skip
        assert peak_threads == stack_guard.MAX_CONNECTIONS, peak_threads  # the others closed before any thread
        assert grown < 16 * 2**20, grown
        for connection in held:
            connection.close()
        held.clear()
        time.sleep(0.5)
        WorkerNotificationClient(service.addresses(), key, verbose=0).notify_hosts_updated(7.0, HostUpdateResult.added)
    finally:
        for connection in held:
            connection.close()
        quick.shutdown()
        service.shutdown()
    assert manager.updates == [(7.0, HostUpdateResult.added)]


def test_a_service_listens_on_the_pinned_nics_address_only():
    assert guard.listen_address(None) == "" and guard.listen_address(set()) == ""
    assert guard.listen_address("lo") == "127.0.0.1" and guard.listen_address({"lo"}) == "127.0.0.1"
    with pytest.raises(RuntimeError, match="the pinned network interface hst-none has no IPv4 address on this node"):
        guard.listen_address("hst-none")
    advertised = {"lo": [("127.0.0.1", 4000)], "eth0": [("10.0.0.11", 4000), ("10.0.0.99", 4000)]}
    assert guard.bound_only(advertised, "10.0.0.11") == {"eth0": [("10.0.0.11", 4000)]}
    assert guard.bound_only(advertised, "") == advertised


class Driver:
    """What the elastic rendezvous handler asks of horovodrun's driver."""

    def __init__(self) -> None:
        self.registered: list[tuple] = []

    def register_worker_server(self, host, local_rank, addresses, secret_key) -> None:
        self.registered.append((host, local_rank, addresses, secret_key))


@pytest.fixture
def rendezvous(monkeypatch):
    """The installed (patched) Horovod runner's elastic rendezvous server, started as horovodrun starts it on a
    pinned NIC (loopback here), with the job's secret in its environment."""
    from horovod.runner.elastic.rendezvous import create_rendezvous_handler
    from horovod.runner.http import http_server

    assert "stack_guard" in Path(http_server.__file__).read_text(), (
        "this checkout's Horovod runner is not patched: scripts/setup.sh (docker/horovod-runner/patch.py)"
    )
    monkeypatch.setenv(guard.TOKEN_VARIABLE, TOKEN)
    driver = Driver()
    server = http_server.RendezvousServer()
    port = server.start(create_rendezvous_handler(driver), address="127.0.0.1")
    yield server, port, driver
    server.stop()


def ask(port: int, method: str, path: str, body: bytes | None = None, token: str | None = None) -> int | str:
    """The HTTP status, or the error's name where the server closed the connection without one."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        connection.request(method, path, body=body, headers=headers)
        return connection.getresponse().status
    except (OSError, http.client.HTTPException) as error:
        return type(error).__name__
    finally:
        connection.close()


def test_the_rendezvous_server_takes_the_jobs_requests_and_refuses_a_strangers(rendezvous, tmp_path, capfd):
    server, port, driver = rendezvous
    assert server._httpd.server_address == ("127.0.0.1", port)  # not every address of the node
    marker = tmp_path / "ran"
    attack = base64.b64encode(pickle.dumps((RunsCode(marker), b"key")))
    assert ask(port, "PUT", "/worker_addresses/intruder:0", attack) == 403
    assert ask(port, "PUT", "/worker_addresses/intruder:0", attack, token="guessed") == 403
    sent = ({"lo": [("127.0.0.1", 40123)]}, b"\x02" * 32)
    assert ask(port, "PUT", "/worker_addresses/node_2:0", base64.b64encode(cloudpickle.dumps(sent)), TOKEN) == 200
    assert driver.registered == [("node_2", 0, *sent)]
    assert ask(port, "GET", "/worker_addresses/node_2:0", token=TOKEN) == 403  # the rank's key stays the driver's
    assert ask(port, "PUT", "/global/0", b"gloo's address", TOKEN) == 200
    assert ask(port, "GET", "/global/0", token=TOKEN) == 200
    assert not marker.exists()
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("horovod-stack: refused")]
    assert lines == [  # the next two from the same address within the minute: counted, not told
        "horovod-stack: refused a rendezvous request from 127.0.0.1 (PUT '/worker_addresses/intruder:0'): no job "
        "secret",
    ]
    # a pickle that runs code, sent with the job's secret, still builds nothing (the request fails unanswered)
    assert ask(port, "PUT", "/worker_addresses/node_3:0", attack, TOKEN) == "RemoteDisconnected"
    assert not marker.exists() and len(driver.registered) == 1


def test_a_connection_whose_thread_could_not_start_gives_its_slot_back(monkeypatch):
    """guard_server takes a connection's slot before a thread is started for it, and the handler gives it back when
    the connection ends. When the system has no thread to give (`can't start new thread`), no handler ever runs: the
    slot must come back all the same, or MAX_CONNECTIONS such failures would close the service to the job itself."""
    import socketserver
    import threading

    class Echo(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.wfile.write(self.rfile.readline())

    handler = guard.bounded(Echo)
    server = guard.guard_server(socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler))
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    start = threading.Thread.start
    failures = guard.MAX_CONNECTIONS  # every slot, were each one kept

    def no_thread_to_give(thread: threading.Thread) -> None:
        nonlocal failures
        if thread.name != serving.name and failures:
            failures -= 1
            raise RuntimeError("can't start new thread")
        start(thread)

    try:
        monkeypatch.setattr(threading.Thread, "start", no_thread_to_give)
        for _ in range(guard.MAX_CONNECTIONS):  # each closed unserved, as socketserver does when process_request fails
            with socket.create_connection(server.server_address) as connection:
                assert closed_by_the_server(connection, within=5)
        monkeypatch.setattr(threading.Thread, "start", start)
        with socket.create_connection(server.server_address) as connection:
            connection.sendall(b"still served\n")
            connection.settimeout(5)
            assert connection.makefile("rb").readline() == b"still served\n"
        assert failures == 0
    finally:
        server.shutdown()
        server.server_close()
