"""Our fixes to an installed Horovod 0.28.1 runner (pure Python: no rebuild), for the jobs horovodrun starts (elastic
jobs, the CI smoke role):
    python3 docker/horovod-runner/patch.py SITE_PACKAGES

- Pinned host keys: its ssh passed `-o StrictHostKeyChecking=no`, and a command-line option wins over the cluster's
  ~/.ssh/config, so a worker with any host key was trusted. Without it the pinned known_hosts applies, as for
  mpirun's ssh and the job agent's (launcher/core/jobspec.py ssh_config).
- No values on command lines: it put every variable of its environment on each rank's command line (visible in `ps`
  on the driver's node and on every worker), secret settings included. Now a rank's command line carries only the
  variables that differ from horovodrun's own environment (the per-rank HOROVOD_* ones and the like); the others
  reach local ranks by inheritance, and remote ranks as one record on the ssh channel's stdin (env_channel.py,
  installed beside the runner's util modules: no count limit, unlike ssh's SendEnv, whose sshd ignores a session's
  variables past 128; the workers' sshd takes no variable from a client).
- A closed rendezvous (stack_guard.py, installed beside the runner's util modules): horovodrun makes one secret per
  job for its ranks' environment; its HTTP servers refuse a request without it (403, one line naming the sender),
  and a GET of the ranks' notification keys; nothing from the network is unpickled but plain data (the rendezvous)
  or the runner's own message records (its HMAC-signed services); the rendezvous and key-value servers listen on
  the address the ranks are given for them, and each rank's notification service on its pinned NIC's address (every
  address only where no NIC is pinned: horovodrun's own task services, which the stack never starts). The
  host-update flag crosses as a plain int: Python 3.11.2 (Debian 12's) pickles an IntFlag member as
  `getattr(HostUpdateResult, 'added')`, and a loader that admitted getattr would admit any attribute of anything.
  The ranks' Gloo sends the secret too (docker/patch-horovod-source.sh). The HMAC-signed services (a rank's
  notification service) read a message's length before its HMAC can be checked: a length of -1 meant "read until
  the connection closes", with no timeout; now a length outside 0..4 MiB is refused unread, an idle connection
  ends after 30 s, and at most 32 connections are served at once. Each of the runner's servers queues 128 connections
  before accepting them, not socketserver's 5, so a stranger's burst does not crowd out the job's own connections.

Each edit is an exact text replacement that must match once, so a Horovod whose runner changed fails here, loudly,
instead of shipping unpatched; an edit already made is left as it is (running this twice changes nothing), and one
an earlier patch.py made otherwise is made anew where the edit names that earlier text.
"""

from __future__ import annotations

import py_compile
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "# horovod-stack"

INSTALLED = ("stack_guard.py", "env_channel.py")
"""Our modules, installed beside the runner's util modules (horovod.runner.common.util)."""

# Each edit: (old, new) or (old, new, what an earlier patch.py made of old), so that a runner patched before is
# brought up to date too.
EDITS: dict[str, list[tuple[str, ...]]] = {
    "runner/util/remote.py": [
        (
            "SSH_COMMAND_PREFIX = 'ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no'\n",
            f"SSH_COMMAND_PREFIX = 'ssh -o PasswordAuthentication=no'  {MARK}: pinned host keys\n",
            # what an earlier patch.py made of that line (a host's .venv patched before): ssh sent the environment
            f"SSH_COMMAND_PREFIX = \"ssh -o PasswordAuthentication=no -o 'SendEnv=*'\"  {MARK}: pinned keys, env by ssh\n",
        ),
    ],
    "runner/gloo_run.py": [
        (
            "from horovod.runner.common.util import env as env_util, safe_shell_exec\n",
            "from horovod.runner.common.util import env as env_util, safe_shell_exec\n"
            f"from horovod.runner.common.util import env_channel  {MARK}\n",
        ),
        (
            "            local_command = quote('cd {pwd} > /dev/null 2>&1 ; {command}'\n"
            "                                  .format(pwd=os.getcwd(), command=command))\n"
            "            command = get_remote_command(local_command,\n"
            "                                         host=host_name,\n"
            "                                         port=settings.ssh_port,\n"
            "                                         identity_file=settings.ssh_identity_file)\n",
            f"            {MARK}: the environment on ssh's stdin (env_channel), received before the command runs\n"
            "            local_command = quote(env_channel.receiving('cd {pwd} > /dev/null 2>&1 ; {command}'\n"
            "                                                        .format(pwd=os.getcwd(), command=command)))\n"
            "            command = env_channel.sending(get_remote_command(local_command,\n"
            "                                                             host=host_name,\n"
            "                                                             port=settings.ssh_port,\n"
            "                                                             identity_file=settings.ssh_identity_file))\n",
        ),
        (
            "if env_util.is_exportable(key)]),\n",
            "if env_util.is_exportable(key) and os.environ.get(key) != value]),"
            f"  {MARK}: inherited or sent by ssh, never on a command line\n",
        ),
        (
            "    global_rendezv_port = rendezvous.start()\n",
            f"    global_rendezv_port = rendezvous.start(address=server_ip)  {MARK}: where the ranks reach it\n",
        ),
        (
            "        run_func_server_port = run_func_server.start_server()\n",
            f"        run_func_server_port = run_func_server.start_server(server_ip)  {MARK}: where the ranks reach it\n",
        ),
        (
            "    global_rendezv_port = rendezvous.start(handler)\n",
            "    global_rendezv_port = rendezvous.start(\n"
            f"        handler, address=network.get_driver_ip(settings.nics) if settings.nics else '')  {MARK}: pinned NIC\n",
        ),
    ],
    "runner/launch.py": [
        (
            "\nimport horovod\n",
            f"\nimport horovod\nfrom horovod.runner.common.util import stack_guard  {MARK}\n",
        ),
        (
            "        run_func_server_port = run_func_server.start_server()\n",
            f"        run_func_server_port = run_func_server.start_server(driver_ip)  {MARK}: where the ranks reach it\n",
        ),
        (
            "def _run(args):\n",
            f"def _run(args):\n    stack_guard.ensure_job_token()  {MARK}: this job's rendezvous secret, for its ranks\n",
        ),
    ],
    "runner/util/network.py": [
        (
            "from horovod.runner.util import threads\n",
            f"from horovod.runner.common.util import stack_guard  {MARK}\nfrom horovod.runner.util import threads\n",
        ),
        (
            "def find_port(server_factory):\n",
            f"def find_port(server_factory, address=''):  {MARK}: the address to listen on ('': every one)\n",
        ),
        ("            addr = ('', port)\n", "            addr = (address, port)\n"),
        (
            "            server = server_factory(addr)\n",
            f"            server = stack_guard.guard_server(server_factory(addr))  {MARK}: a deep queue; connections bounded\n",
        ),
    ],
    "runner/common/util/network.py": [
        (
            "from horovod.runner.common.util import secret\n",
            f"from horovod.runner.common.util import secret, stack_guard  {MARK}\n",
        ),
        (
            "        return cloudpickle.loads(message)\n",
            f"        return stack_guard.loads_message(message)  {MARK}: the runner's messages only\n",
        ),
        (
            "        digest = rfile.read(secret.DIGEST_LENGTH)\n"
            "        # Unpack message length into 4-byte integer.\n"
            "        message_len = struct.unpack('i', rfile.read(4))[0]\n"
            "        message = rfile.read(message_len)\n",
            f"        digest, message = stack_guard.read_signed(rfile, secret.DIGEST_LENGTH)  {MARK}: bounded, timed\n",
        ),
        (
            "        return _Handler\n",
            f"        return stack_guard.bounded(_Handler)  {MARK}: idle connections time out; a bounded number at once\n",
        ),
        (
            "        self._server, _ = find_port(\n"
            "            lambda addr: socketserver.ThreadingTCPServer(\n"
            "                addr, self._make_handler()))\n",
            f"        listen_address = stack_guard.listen_address(nics)  {MARK}: the pinned NIC's\n"
            "        self._server, _ = find_port(\n"
            "            lambda addr: socketserver.ThreadingTCPServer(\n"
            "                addr, self._make_handler()), listen_address)\n",
        ),
        (
            "        self._addresses = self._get_local_addresses()\n",
            f"        self._addresses = stack_guard.bound_only(self._get_local_addresses(), listen_address)  {MARK}\n",
        ),
    ],
    "runner/http/http_server.py": [
        (
            "from horovod.runner.util.network import find_port\n",
            f"from horovod.runner.common.util import stack_guard  {MARK}\n"
            "from horovod.runner.util.network import find_port\n",
        ),
        (
            "    # Set timeout\n    timeout = SINGLE_REQUEST_TIMEOUT\n",
            "    # Set timeout\n    timeout = SINGLE_REQUEST_TIMEOUT\n\n"
            f"    {MARK}: only the job's own requests (its secret), and no rank's notification key read back\n"
            "    def parse_request(self):\n"
            "        return super().parse_request() and stack_guard.admit(self)\n",
        ),
        (
            "    def start(self, handler_cls=RendezvousHandler):\n",
            f"    def start(self, handler_cls=RendezvousHandler, address=''):  {MARK}: the address to listen on\n",
        ),
        (
            "                addr, handler_cls, self._verbose))\n",
            "                addr, handler_cls, self._verbose), address)\n",
        ),
        (
            "    def start_server(self):\n",
            f"    def start_server(self, address=''):  {MARK}: the address to listen on\n",
        ),
        (
            "                addr, KVStoreHandler, self.verbose))\n",
            "                addr, KVStoreHandler, self.verbose), address)\n",
        ),
    ],
    "runner/http/http_client.py": [
        (
            "from horovod.runner.common.util import codec\n",
            f"from horovod.runner.common.util import codec, stack_guard  {MARK}\n",
        ),
        ("        req = Request(url)\n", "        req = Request(url, headers=stack_guard.auth_headers())\n"),
        (
            "        req = Request(url, data=codec.dumps_base64(value, to_ascii=False))\n",
            "        req = Request(url, data=codec.dumps_base64(value, to_ascii=False), headers=stack_guard.auth_headers())\n",
        ),
    ],
    "runner/elastic/worker.py": [
        (
            "            self._manager.handle_hosts_updated(req.timestamp, req.res)\n",
            "            self._manager.handle_hosts_updated(req.timestamp, HostUpdateResult(req.res))"
            f"  {MARK}: an int on the wire\n",
        ),
        (
            "        self._send(HostsUpdatedRequest(timestamp, update_res))\n",
            f"        self._send(HostsUpdatedRequest(timestamp, int(update_res)))  {MARK}: no enum in the pickle\n",
        ),
    ],
    "runner/elastic/rendezvous.py": [
        (
            "from horovod.runner.common.util import codec\n",
            f"from horovod.runner.common.util import stack_guard  {MARK}\n",
        ),
        (
            "                addresses, secret_key = codec.loads_base64(value)\n",
            f"                addresses, secret_key = stack_guard.loads_plain_base64(value)  {MARK}: plain data only\n",
        ),
    ],
}


def apply(text: str, old: str, new: str, *earlier: str) -> str:
    """`text` with `old` (or what an earlier patch.py made of it: `earlier`) replaced by `new`, once."""
    if new in text:
        return text
    for found in (old, *earlier):
        if text.count(found) == 1:
            return text.replace(found, new)
    raise SystemExit(f"patch.py: {old.strip()[:60]!r} is there {text.count(old)} times, not once: "
                     "this Horovod's runner changed; check docker/horovod-runner/patch.py")


def patch(site: Path) -> list[Path]:
    """Applies every edit under SITE/horovod (and installs INSTALLED); the files it changed or checked."""
    horovod = site / "horovod"
    files = []
    for relative, edits in EDITS.items():
        path = horovod / relative
        text = path.read_text()
        for edit in edits:
            text = apply(text, *edit)
        path.write_text(text)
        files.append(path)
    for name in INSTALLED:
        module = horovod / "runner/common/util" / name
        module.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HERE / name, module)
        files.append(module)
    for path in files:
        py_compile.compile(str(path), doraise=True)
    return files


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: patch.py SITE_PACKAGES")
    changed = patch(Path(sys.argv[1]))
    print(f"patch-horovod-runner: patched {len(changed)} files under {sys.argv[1]}/horovod/runner")
