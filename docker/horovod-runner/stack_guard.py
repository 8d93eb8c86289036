"""horovod-stack's guard on what horovodrun opens to the network (installed as horovod/runner/common/util/stack_guard.py
by docker/horovod-runner/patch.py; its callers are the patched runner's modules).

Horovod 0.28.1's runner listens on every address of the node and trusts whatever reaches it: its rendezvous server
(HTTP) unpickles the body of any `PUT /worker_addresses/...` (code execution for anyone who reaches the port) and
hands each rank's notification key to any `GET`. This module owns the rules that close that hole:
- one secret per job (TOKEN_VARIABLE): horovodrun makes it and hands it to its ranks through their environment
  (inherited, or ssh's own channel; never a command line); every request to its HTTP servers must carry it
  (`Authorization: Bearer`, also sent by the ranks' Gloo, docker/patch-horovod-source.sh), or gets a 403 and one
  line on horovodrun's stderr naming the address it came from;
- no one may read a rank's notification key back (GET on PRIVATE_SCOPES is refused);
- no pickle from the network builds anything but plain data, or the runner's own message records;
- a server listens on the pinned NIC's address, not on every address, when a NIC is pinned.
Only the standard library and psutil (which the runner already needs): it imports nothing of Horovod's.
"""

import base64
import hmac
import io
import os
import pickle
import secrets
import socket
import struct
import sys
import threading
import time

import psutil

TOKEN_VARIABLE = "HOROVOD_STACK_RENDEZVOUS_TOKEN"
"""The job's rendezvous secret, in horovodrun's environment and so in every rank's."""

PRIVATE_SCOPES = ("worker_addresses",)
"""Scopes no one reads back (horovod.runner.elastic.rendezvous.PUT_WORKER_ADDRESSES: each rank's notification
service address and HMAC key, for horovodrun's driver alone)."""

REFUSAL_LINE = "horovod-stack: refused a rendezvous request from "
"""How a refusal's line on horovodrun's stderr begins (the job agent's stall watch counts such lines as no progress:
launcher/core/stall.py's REFUSAL_MARK, held equal by tests/test_rendezvous_guard.py)."""

TELL_EVERY_SECONDS = 60.0
"""A refusal is told at most once a minute per address, so a stranger's flood neither grows the job's log nor passes
for the job's progress; the next line says how many went untold."""

MAX_MESSAGE_BYTES = 4 << 20
"""The largest message the runner's HMAC-signed services read (their records are a few hundred bytes; a rank's
command and environment a few KB): a longer or negative length is refused before anything is read or allocated."""

IDLE_SECONDS = 30.0
"""How long a connection to such a service may wait for what it must send, before its HMAC is checked or after."""

MAX_CONNECTIONS = 32
"""Connections one such service serves at once; more are closed unread, so a stranger holding many open costs a
bounded number of threads (a rank's notification service serves one message per host update)."""

BACKLOG = 128
"""Connections the kernel queues for each of the runner's servers before it accepts them (socketserver's own is 5): a
stranger's burst of connections then costs neither a rank's nor the driver's connection its place in the queue."""

MAX_BODY_BYTES = 1 << 20
"""A rendezvous value is a few hundred bytes (addresses, Gloo's keys); a larger body is refused unread."""

MESSAGES = {
    "horovod.runner.common.util.network": ("PingRequest", "PingResponse", "AckResponse", "AckStreamResponse"),
    "horovod.runner.common.service.compute_service": (
        "RegisterDispatcherRequest", "WaitForDispatcherRegistrationRequest", "WaitForDispatcherRegistrationResponse",
        "RegisterDispatcherWorkerRequest", "WaitForDispatcherWorkerRegistrationRequest", "ShutdownRequest",
        "WaitForShutdownRequest",
    ),
    "horovod.runner.common.service.driver_service": (
        "RegisterTaskToTaskAddressesRequest", "AllTaskAddressesRequest", "AllTaskAddressesResponse",
        "RegisterTaskRequest",
    ),
    "horovod.runner.common.service.task_service": (
        "RunCommandRequest", "StreamCommandOutputRequest", "StreamCommandStdOutRequest", "StreamCommandStdErrRequest",
        "AbortCommandRequest", "CommandExitCodeRequest", "CommandExitCodeResponse", "WaitForCommandExitCodeRequest",
        "WaitForCommandExitCodeResponse", "NotifyInitialRegistrationCompleteRequest", "RegisterCodeResultRequest",
    ),
    "horovod.runner.task.task_service": ("TaskToTaskAddressCheckFinishedSignalResponse",),
    "horovod.runner.elastic.worker": ("HostsUpdatedRequest",),
}
"""The runner's service messages, as (module, class name) pairs admitted exactly: every class named *Request or
*Response that Horovod 0.28.1's runner defines (a class is pickled by the module that defines it). A dotted name
(protocol 4 walks attributes: `PingRequest.__init__.__globals__...`) is no entry here, so it is refused."""


def ensure_job_token():
    """The job's secret: the one in the environment (a caller may give its own), else a new one put there, so that
    every rank horovodrun starts inherits it."""
    token = os.environ.get(TOKEN_VARIABLE)
    if not token:
        token = os.environ[TOKEN_VARIABLE] = secrets.token_urlsafe(32)
    return token


def auth_headers():
    """The header a client of the job's HTTP servers sends (a rank, or horovodrun itself)."""
    token = os.environ.get(TOKEN_VARIABLE)
    return {"Authorization": "Bearer " + token} if token else {}


def refusal(method, path, headers, expected_token):
    """Why a request to the job's HTTP server is refused; None when it is admitted. `headers` maps names to values
    (http.server's message object or a dict)."""
    if not expected_token:
        return "this server has no job secret (" + TOKEN_VARIABLE + " unset); horovodrun sets it for its ranks"
    given = headers.get("Authorization") or ""
    if not hmac.compare_digest(given.encode(), ("Bearer " + expected_token).encode()):
        return "a wrong job secret" if given else "no job secret"
    parts = path.split("/")
    if method == "GET" and len(parts) > 1 and parts[1] in PRIVATE_SCOPES:
        return "the " + parts[1] + " scope is not readable"
    length = headers.get("Content-Length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        return "a body of " + repr(length[:20]) + " bytes (at most " + str(MAX_BODY_BYTES) + ")"
    return None


class RefusalLog:
    """When a refusal from an address is told: its first, then at most one a TELL_EVERY_SECONDS (thread-safe: the
    rendezvous server serves each request in a thread)."""

    def __init__(self):
        self._told = {}  # address -> [when last told, refusals since then]
        self._lock = threading.Lock()

    def untold_before(self, address, now):
        """The count of this address's refusals left untold since its last line, if this one is to be told; None
        when it is not (it is counted)."""
        with self._lock:
            entry = self._told.get(address)
            if entry is not None and now - entry[0] < TELL_EVERY_SECONDS:
                entry[1] += 1
                return None
            self._told[address] = [now, 0]
            return entry[1] if entry is not None else 0


_refusals = RefusalLog()


def admit(handler):
    """For an http.server request handler, once its request line and headers are parsed: True to serve it; else a
    403 is sent, the connection closed and one line written to stderr naming where the request came from (at most
    one a minute per address)."""
    why = refusal(handler.command, handler.path, handler.headers, os.environ.get(TOKEN_VARIABLE))
    if why is None:
        return True
    address = handler.client_address[0]
    untold = _refusals.untold_before(address, time.monotonic())
    if untold is not None:
        more = " (and %d more from it untold in the last minute)" % untold if untold else ""
        sys.stderr.write(REFUSAL_LINE + "%s (%s %r): %s%s\n" % (address, handler.command, handler.path[:80], why, more))
        sys.stderr.flush()
    handler.send_response(403)
    handler.send_header("Content-Length", "0")
    handler.end_headers()
    handler.close_connection = True
    return False


def listen_address(nics):
    """The IPv4 address a service of the job listens on: the pinned NIC's (`nics`: one name, or the names given to
    horovodrun's --network-interface; the last IPv4 address of the first, as Horovod's get_driver_ip picks), or ''
    (every address, Horovod's own behaviour) when no NIC is pinned."""
    if not nics:
        return ""
    name = nics if isinstance(nics, str) else sorted(nics)[0]
    found = [entry.address for entry in psutil.net_if_addrs().get(name, []) if entry.family == socket.AF_INET]
    if not found:
        raise RuntimeError("the pinned network interface " + name + " has no IPv4 address on this node")
    return found[-1]


def bound_only(addresses, address):
    """A service's advertised {NIC: [(address, port)]} cut to the address it listens on ('' : all of them)."""
    if not address:
        return addresses
    return {nic: [pair for pair in pairs if pair[0] == address] for nic, pairs in addresses.items()
            if any(pair[0] == address for pair in pairs)}


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain data only (numbers, strings, bytes, lists, tuples, dicts, sets): any class or function refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused to load " + module + "." + name + " from the network: plain data only")


class _MessageUnpickler(pickle._Unpickler):
    """Plain data, and the runner's own message records (MESSAGES; the patched runner sends the elastic host-update
    flag as an int). Python's own unpickler, not its C twin, because only it lets BUILD be checked: BUILD sets
    attributes on what it is given, and given a class (an admitted one) it would change that class for the whole
    process."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module, name):
        if name in MESSAGES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError("refused to load " + module + "." + name + " from the network: not a message")

    def load_build(self):
        if isinstance(self.stack[-2], type):
            raise pickle.UnpicklingError(
                "refused to set attributes on the class " + self.stack[-2].__qualname__ + " from the network"
            )
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = load_build


class MessageRefused(EOFError):
    """A message the runner's services do not read: too long, of a negative length, cut short or never sent. An
    EOFError, which their handlers already take quietly, as a client that went away (no traceback per stranger)."""


def _read_exactly(rfile, count):
    try:
        data = rfile.read(count)
    except (TimeoutError, OSError) as error:
        raise MessageRefused("nothing came within " + str(IDLE_SECONDS) + " s (" + type(error).__name__ + ")")
    if len(data) != count:
        raise MessageRefused("cut short")
    return data


def read_signed(rfile, digest_length):
    """A message of the runner's wire format (its HMAC digest, a 4-byte length, the body): (digest, body), each read
    in full, the length checked before the body is read."""
    digest = _read_exactly(rfile, digest_length)
    (length,) = struct.unpack("i", _read_exactly(rfile, 4))
    if not 0 <= length <= MAX_MESSAGE_BYTES:
        raise MessageRefused("a length of " + str(length) + " bytes (at most " + str(MAX_MESSAGE_BYTES) + ")")
    return digest, _read_exactly(rfile, length)


def bounded(handler_class):
    """A socketserver handler class of the runner's services, made to time out an idle connection (IDLE_SECONDS);
    with guard_server, its server serves at most MAX_CONNECTIONS connections at once."""
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    class Bounded(handler_class):
        timeout = IDLE_SECONDS  # StreamRequestHandler.setup sets it on the connection
        connection_slots = slots  # taken by guard_server's check, in the accepting thread

        def __init__(self, *args, **kwargs):
            try:
                super().__init__(*args, **kwargs)  # setup, handle, finish: the whole connection
            finally:
                slots.release()

    return Bounded


def guard_server(server):
    """A socketserver server of the runner's, just made: its listen queue BACKLOG deep (listen() again sets it), and,
    where its handler is `bounded`, each connection's slot taken before a thread is started for it; a connection
    beyond MAX_CONNECTIONS is closed unread by the accepting thread, so it costs no thread at all."""
    server.socket.listen(BACKLOG)
    slots = getattr(server.RequestHandlerClass, "connection_slots", None)
    if slots is not None:
        server.verify_request = lambda request, client_address: slots.acquire(blocking=False)
        serve = server.process_request

        def process_request(request, client_address):
            try:
                serve(request, client_address)
            except BaseException:
                slots.release()  # no thread started (the system had none to give): no handler releases its slot
                raise

        server.process_request = process_request
    return server


def loads_plain(data):
    return _PlainUnpickler(io.BytesIO(data)).load()


def loads_plain_base64(encoded):
    return loads_plain(base64.b64decode(encoded))


def loads_message(data):
    return _MessageUnpickler(io.BytesIO(data)).load()
