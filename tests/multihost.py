"""Several Docker hosts on this one machine, for the launcher's tests.

Each node is a network namespace with its own address on a private bridge and its own dockerd. node_1's engine
is reached the default way, over ssh:// (an sshd in its namespace fronts its engine's socket); the others through
a unix:// override, as .env allows. Names resolve through /etc/hosts, which host-network containers copy.
Everything is created here and removed again on every exit path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import psutil

from launcher.core import layers

NIC = "hst0"
"""Each node's one NIC, inside its namespace."""
SHARED_HOST_NAME = "gpu-server"
"""The host name every test host's engine reports."""
PRIVATE_ENGINE = Path("/opt/horovod-stack/engine/root/usr")
"""Where scripts/host-setup.sh unpacks Debian 13's engine when the host has none of its own."""


TEST_ROOT = Path("/var/lib/horovod-stack-test")


@dataclass(frozen=True)
class Network:
    """The names one harness takes on this machine: its bridge, subnet, namespaces, veths, /etc/hosts lines, folder
    and node names. Each harness has a number of its own, so two run at once (the test hosts every multi-host module
    shares, and a module's own) and each removes only what is its own."""

    number: int = 0
    node_prefix: str = "node"

    @property
    def bridge(self) -> str:
        return f"hstbr{self.number}"

    @property
    def subnet(self) -> str:
        """The first three octets: nodes are .11 and up, this machine's end of the bridge .1."""
        return f"10.213.{7 + self.number}"

    @property
    def namespace_prefix(self) -> str:
        return f"hst{self.number}-"

    @property
    def hosts_mark(self) -> str:
        return f"# horovod-stack test node, harness {self.number}"

    @property
    def folder(self) -> Path:
        return TEST_ROOT / f"harness-{self.number}"

    @property
    def veth_prefix(self) -> str:
        return f"hst{self.number}v"

    def veth(self, index: int) -> str:
        """This machine's end of node `index`'s link."""
        return f"{self.veth_prefix}{index}"

    def node(self, index: int) -> TestNode:
        return TestNode(f"{self.node_prefix}_{index}", index, self)


def engine_env() -> dict[str, str]:
    """The environment for a node's dockerd: the host's own engine, or the one host-setup.sh unpacked."""
    path = os.environ["PATH"]
    if shutil.which("dockerd") is None and (PRIVATE_ENGINE / "sbin" / "dockerd").exists():
        path = f"{PRIVATE_ENGINE}/sbin:{PRIVATE_ENGINE}/bin:{path}"
    return {**os.environ, "PATH": path}


def sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kwargs)


@dataclass
class TestNode:
    __test__ = False  # a test host, not a pytest test class

    name: str
    index: int
    network: Network
    root: Path = Path()
    dockerd: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def namespace(self) -> str:
        return f"{self.network.namespace_prefix}{self.name.replace('_', '')}"

    @property
    def address(self) -> str:
        return f"{self.network.subnet}.{10 + self.index}"

    @property
    def veth(self) -> str:
        return self.network.veth(self.index)

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def engine_url(self) -> str:
        return f"unix://{self.socket}"

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.engine_url, timeout=600)

    def in_namespace(self, *argv: str) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.namespace}", *argv]

    def listening(self) -> list[tuple[str, int, str]]:
        """(address, port, process) of every TCP socket listening in the node's namespace, as `ss` shows them."""
        lines = subprocess.run(self.in_namespace("ss", "-Hltnp"), capture_output=True, text=True, check=True).stdout
        sockets = []
        for line in lines.splitlines():
            words = line.split()
            address, port = words[3].rsplit(":", 1)
            sockets.append((address, int(port), words[-1]))
        return sockets


@dataclass
class Cluster:
    root: Path
    network: Network = field(default_factory=Network)
    nodes: list[TestNode] = field(default_factory=list)
    """The nodes a job runs on (NODES in env_file)."""
    spares: list[TestNode] = field(default_factory=list)
    """Hosts ready for `--spares` (an engine each, reachable by override), in no job unless a test names them."""
    processes: list[subprocess.Popen] = field(default_factory=list)
    ssh_dir: Path | None = None

    # --- the network ----------------------------------------------------------------------------------------
    @property
    def every_node(self) -> list[TestNode]:
        return self.nodes + self.spares

    def start(self, count: int = 2, spares: int = 0) -> None:
        bridge = self.network.bridge
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.bridge_address}/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        # dockerd sets FORWARD to DROP and bridged frames pass iptables: let the nodes talk to each other.
        sh("iptables", "-I", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT")
        hosts = []
        for index in range(1, count + spares + 1):
            node = self.network.node(index)
            node.root = self.root / node.name
            node.root.mkdir(parents=True)
            sh("ip", "netns", "add", node.namespace)
            sh("ip", "link", "add", node.veth, "type", "veth", "peer", "name", NIC, "netns", node.namespace)
            sh("ip", "link", "set", node.veth, "master", bridge, "up")
            sh("ip", "-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", NIC)
            sh("ip", "-n", node.namespace, "link", "set", NIC, "up")
            sh("ip", "-n", node.namespace, "link", "set", "lo", "up")
            hosts.append(f"{node.address} {node.name} {self.network.hosts_mark}\n")
            (self.nodes if index <= count else self.spares).append(node)
        with open("/etc/hosts", "a") as etc_hosts:
            etc_hosts.writelines(hosts)
        for node in self.every_node:
            self.start_engine(node)
        self.start_ssh_front(self.nodes[0])

    def start_engine(self, node: TestNode) -> None:
        self.start_dockerd(node)
        # As on hosts where Docker runs with its default bridge: a docker0 of 172.17.0.1/16 on every node, which
        # a rank must not take for a way to another node. (The node engines run with --bridge=none, and such an
        # engine deletes a docker0 it finds at start: so it is made afterwards.)
        sh("ip", "-n", node.namespace, "link", "add", "docker0", "type", "bridge")
        sh("ip", "-n", node.namespace, "addr", "add", "172.17.0.1/16", "dev", "docker0")
        sh("ip", "-n", node.namespace, "link", "set", "docker0", "up")

    def stop_engine(self, node: TestNode) -> None:
        if node.dockerd is not None:
            self.processes.remove(node.dockerd)
            stop_process_group(node.dockerd)
            node.dockerd = None
        sh("ip", "-n", node.namespace, "link", "delete", "docker0", check=False)

    def start_dockerd(self, node: TestNode) -> None:
        log = open(node.root / "dockerd.log", "a")
        node.dockerd = subprocess.Popen(
            # One host name for every node, as servers cloned from one image have: Open MPI tells nodes apart by host
            # name, so the launcher must give each worker its own (its containers would otherwise take this one).
            node.in_namespace(
                "unshare",
                "--uts",
                "sh",
                "-c",
                f'hostname {SHARED_HOST_NAME} && exec "$0" "$@"',
                "dockerd",
                "--data-root",
                str(node.root / "data"),
                "--exec-root",
                str(node.root / "exec"),
                "--pidfile",
                str(node.root / "dockerd.pid"),
                "-H",
                node.engine_url,
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--insecure-registry",
                f"{self.network.subnet}.0/24",
            ),  # tests/registry.py, over plain HTTP
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=engine_env(),
        )
        self.processes.append(node.dockerd)
        deadline = time.monotonic() + 60
        while True:
            try:
                node.client().ping()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dockerd for {node.name} did not start: {(node.root / 'dockerd.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.5)

    def start_ssh_front(self, node: TestNode) -> None:
        """An sshd in the node's namespace whose sessions have DOCKER_HOST set to that node's engine, so that
        ssh://node_1 reaches node_1's dockerd (the socket by its path: an engine restarted by link_image is found
        again); and an ssh client config that pins its host key."""
        self.ssh_dir = self.root / "ssh"
        self.ssh_dir.mkdir()
        for key in ("host_key", "client_key"):
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.ssh_dir / key))
        shutil.copy(self.ssh_dir / "client_key.pub", self.ssh_dir / "authorized_keys")
        (self.ssh_dir / "known_hosts").write_text(
            f"{node.name} {' '.join((self.ssh_dir / 'host_key.pub').read_text().split()[:2])}\n"
        )
        (self.ssh_dir / "config").write_text(
            f"Host {node.name}\n  User root\n  IdentityFile {self.ssh_dir / 'client_key'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.ssh_dir / 'known_hosts'}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
        )
        bin_dir = self.ssh_dir / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {self.ssh_dir / "config"} "$@"\n')
        wrapper.chmod(0o755)
        Path("/run/sshd").mkdir(exist_ok=True)
        sshd = (
            f"exec /usr/sbin/sshd -D -e -o SetEnv=DOCKER_HOST={node.engine_url} "
            f"-p 22 -o ListenAddress={node.address} -h {self.ssh_dir / 'host_key'} "
            f"-o AuthorizedKeysFile={self.ssh_dir / 'authorized_keys'} -o StrictModes=no "
            f"-o PidFile={self.ssh_dir / 'sshd.pid'} -o PasswordAuthentication=no"
        )
        log = open(self.ssh_dir / "sshd.log", "w")
        self.processes.append(
            subprocess.Popen(
                node.in_namespace("sh", "-c", sshd),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        deadline = time.monotonic() + 30
        while sh("ssh", "-F", str(self.ssh_dir / "config"), node.name, "docker", "version", check=False).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"ssh front for {node.name} did not answer: {(self.ssh_dir / 'sshd.log').read_text()}"
                )
            time.sleep(0.5)

    # --- what tests use -------------------------------------------------------------------------------------
    @property
    def bridge_address(self) -> str:
        """This machine's address on the test network (where tests/registry.py serves)."""
        return f"{self.network.subnet}.1"

    def launcher_env(self) -> dict[str, str]:
        """Environment for running `launcher` against these nodes: node_1 over ssh://, the rest by override."""
        assert self.ssh_dir is not None, "the harness is not started"
        env = {**os.environ, "PATH": f"{self.ssh_dir / 'bin'}:{os.environ['PATH']}"}
        for node in self.every_node[1:]:
            env[f"DOCKER_HOST_{node.name.upper()}"] = node.engine_url
        return env

    def env_file(self, pin_nic: bool = True) -> Path:
        path = self.root / ("launcher.env" if pin_nic else "launcher-unpinned.env")
        lines = [f"NODES={','.join(n.name for n in self.nodes)}", "READY_TIMEOUT=120"]
        lines += [f"NODE_NETWORK_INTERFACE={NIC}"] if pin_nic else []
        lines += [f"DOCKER_HOST_{node.name.upper()}={node.engine_url}" for node in self.every_node[1:]]
        # The image the tests load and push (IMAGE, e.g. a branch's build), not whatever horovod-stack:latest is now.
        lines += [f"IMAGE={os.environ['IMAGE']}"] if os.environ.get("IMAGE") else []
        path.write_text("\n".join(lines) + "\n")
        return path

    def load_image(self, image: str, node: TestNode) -> float:
        """Copies `image` from this machine's engine to the node's (docker save | docker load); returns the seconds."""
        started = time.monotonic()
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        sh("docker", "-H", node.engine_url, "load", stdin=save.stdout)
        save.wait()
        return time.monotonic() - started

    def has_image(self, image: str, node: TestNode) -> bool:
        """Whether the node holds the very build of `image` that this machine's engine has."""
        try:
            return node.client().images.get(image).id == docker.from_env().images.get(image).id
        except docker.errors.ImageNotFound:
            return False

    def ensure_image(self, image: str, node: TestNode) -> None:
        """The node gets `image` unless it has it already (from an earlier module on these shared hosts)."""
        if not self.has_image(image, node):
            print(f"\n{image} linked into {node.name}'s engine in {self.link_image(image, node):.0f} s")

    def link_image(self, image: str, node: TestNode) -> float:
        """Gives the node this machine's build of `image` in seconds and with no more disk: its layers' files become
        hard links to this machine's engine's (overlay2: image layers are never written to; a container writes a
        layer of its own), its records and tag copies, with the node's engine stopped meanwhile. For a test host that
        needs the image for what a test is about, which is not how it got there (`--push-image` is tested on its
        own). Returns the seconds it took."""
        started = time.monotonic()
        host = docker.from_env()
        source = Path(host.info()["DockerRootDir"])
        details = host.api.inspect_image(image)
        self.stop_engine(node)
        target = node.root / "data"
        records, target_records = source / "image" / "overlay2", target / "image" / "overlay2"
        layer_dirs = []
        (target / "overlay2" / "l").mkdir(parents=True, exist_ok=True)
        for chain in layers.chain_ids(details["RootFS"]["Layers"]):
            layer = Path("layerdb", "sha256", chain.removeprefix("sha256:"))
            if not (target_records / layer).exists():
                (target_records / layer).parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(records / layer, target_records / layer, symlinks=True)
            cache_id = (records / layer / "cache-id").read_text().strip()
            link = (source / "overlay2" / cache_id / "link").read_text().strip()
            if not (target / "overlay2" / "l" / link).is_symlink():
                (target / "overlay2" / "l" / link).symlink_to(f"../{cache_id}/diff")
            if not (target / "overlay2" / cache_id).exists():
                layer_dirs.append(cache_id)
        image_hex = details["Id"].removeprefix("sha256:")
        for part in ("content", "metadata"):
            record = Path("imagedb", part, "sha256", image_hex)
            if (records / record).exists() and not (target_records / record).exists():
                (target_records / record).parent.mkdir(parents=True, exist_ok=True)
                copy = shutil.copytree if (records / record).is_dir() else shutil.copy2
                copy(records / record, target_records / record)
        tags_file = target_records / "repositories.json"
        tags = json.loads(tags_file.read_text()) if tags_file.exists() else {"Repositories": {}}
        for tag in details["RepoTags"]:
            tags["Repositories"].setdefault(tag.rsplit(":", 1)[0], {})[tag] = details["Id"]
        tags_file.write_text(json.dumps(tags))
        # A running engine's data root is a bind mount of itself, and a hard link cannot cross mounts: the links are
        # made in a mount namespace of their own, where that bind mount is lifted.
        if layer_dirs:
            sh(
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'from="$0" to="$1"; shift; while umount -l "$from" 2>/dev/null; do :; done; '
                'cd "$from/overlay2" && exec cp -a --link "$@" "$to/overlay2/"',
                str(source),
                str(target),
                *layer_dirs,
            )
        self.start_engine(node)
        return time.monotonic() - started

    def project_containers(self) -> dict[str, list[str]]:
        return {
            node.name: [
                c.name for c in node.client().containers.list(all=True, filters={"label": "horovod-stack.cluster"})
            ]
            for node in self.every_node
        }

    @contextlib.contextmanager
    def nic_renamed(self, node: TestNode, name: str) -> Iterator[None]:
        """The node's NIC under another name for the block (ens5 on one server, eno1 on another), then back."""

        def rename(old: str, new: str) -> None:
            sh("ip", "-n", node.namespace, "link", "set", old, "down")
            sh("ip", "-n", node.namespace, "link", "set", old, "name", new)
            sh("ip", "-n", node.namespace, "link", "set", new, "up")

        rename(NIC, name)
        try:
            yield
        finally:
            rename(name, NIC)

    @contextlib.contextmanager
    def silenced(self, node: TestNode) -> Iterator[None]:
        """The node drops every packet that reaches it for the block (powered off, or behind a dropping firewall),
        then answers again. Its engine's unix socket, which the tests use, still works."""
        rule = ["INPUT", "-j", "DROP"]
        sh(*node.in_namespace("iptables", "-I", *rule))
        try:
            yield
        finally:
            sh(*node.in_namespace("iptables", "-D", *rule))

    @contextlib.contextmanager
    def link_down(self, node: TestNode) -> Iterator[float]:
        """The node's link down for the block (a pulled cable, a failed switch port, a powered-off host: silence, no
        TCP reset), then up again; yields when it went down (time.monotonic). Its engine's unix socket still works."""
        sh("ip", "-n", node.namespace, "link", "set", NIC, "down")
        try:
            yield time.monotonic()
        finally:
            sh("ip", "-n", node.namespace, "link", "set", NIC, "up")

    @contextlib.contextmanager
    def shaped(self, mbit: float) -> Iterator[None]:
        """Every node's link limited to `mbit` each way for the block (tc token buckets on both ends of its veth, as
        app.bench.netns shapes the benches' links: a slow LAN), then unshaped again."""
        ends = [(["tc"], node.veth) for node in self.nodes]
        ends += [(["tc", "-n", node.namespace], NIC) for node in self.nodes]
        for tc, device in ends:
            sh(
                *tc,
                "qdisc",
                "replace",
                "dev",
                device,
                "root",
                "tbf",
                "rate",
                f"{mbit}mbit",
                "burst",
                "64kb",
                "limit",
                "32mb",
            )
        try:
            yield
        finally:
            for tc, device in ends:
                sh(*tc, "qdisc", "del", "dev", device, "root", check=False)

    def listen_on(self, node: TestNode, port: int) -> subprocess.Popen:
        process = subprocess.Popen(
            node.in_namespace("python3", "-m", "http.server", str(port)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.processes.append(process)
        deadline = time.monotonic() + 30
        while not sh("ip", "netns", "exec", node.namespace, "ss", "-ltnH", f"sport = :{port}").stdout.strip():
            assert process.poll() is None and time.monotonic() < deadline, f"nothing listens on {node.name}:{port}"
            time.sleep(0.1)
        return process

    # --- teardown ---------------------------------------------------------------------------------------------
    def stop(self) -> None:
        for node in self.every_node:
            try:
                for container in node.client().containers.list(all=True):
                    container.remove(force=True)
            except Exception:
                pass
        for process in reversed(self.processes):
            stop_process_group(process)
        self.processes.clear()
        self.teardown_leftovers()
        remove_side_by_side([self.root])

    def teardown_leftovers(self) -> None:
        """Removes what this harness makes, also after a run that was killed before its own teardown: its processes,
        mounts, namespaces, bridge, firewall rule, /etc/hosts lines and the folders (image copies) of earlier ones."""
        base = str(self.root.parent)
        # By process name: sshd retitles itself ("sshd: /usr/sbin/sshd -D ..."), so its argv[0] is no path.
        strays = [
            p
            for p in psutil.process_iter(["cmdline", "name"])
            if p.info["cmdline"]
            and p.pid != os.getpid()
            and any(base in arg for arg in p.info["cmdline"])
            and p.info["name"] in ("dockerd", "sshd", "nsenter", "unshare", "containerd")
        ]
        for process in strays:
            process.terminate()
        psutil.wait_procs(strays, timeout=20)
        for mount in reversed(Path("/proc/mounts").read_text().splitlines()):
            target = mount.split()[1]
            if target.startswith(str(self.root.parent)) and "horovod-stack-test" in target:
                sh("umount", "-l", target, check=False)
        for namespace in sh("ip", "netns", "list", check=False).stdout.split("\n"):
            name = namespace.split(" ")[0]
            if name.startswith(self.network.namespace_prefix):
                # Whatever still runs there (a container's process its engine left behind) would keep the namespace,
                # and with it the node's veth, alive past `ip netns delete`: the next start could not make it again.
                kill_all(sh("ip", "netns", "pids", name, check=False).stdout.split(), f"left in {name}")
                sh("ip", "netns", "delete", name, check=False)
        for link in sh("ip", "-o", "link", "show", "type", "veth", check=False).stdout.splitlines():
            name = link.split(": ")[1].split("@")[0]
            if name.startswith(self.network.veth_prefix):  # this harness's ends, whatever holds their peers
                sh("ip", "link", "delete", name, check=False)
        bridge = self.network.bridge
        sh("ip", "link", "delete", bridge, check=False)
        while sh("iptables", "-D", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT", check=False).returncode == 0:
            pass
        lines = Path("/etc/hosts").read_text().splitlines(keepends=True)
        kept = [line for line in lines if not line.rstrip("\n").endswith(self.network.hosts_mark)]
        if kept != lines:
            Path("/etc/hosts").write_text("".join(kept))
        remove_side_by_side([folder for folder in self.root.parent.glob("*") if folder != self.root])


def kill_all(pids: list[str], where: str) -> None:
    processes = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(int(pid)))
            print(f"\nstopping {processes[-1].name()} ({pid}), {where}")
            processes[-1].kill()
    psutil.wait_procs(processes, timeout=20)


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process's group (a dockerd and its containerd, an sshd), SIGKILL after 30 s."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def remove_side_by_side(folders: list[Path]) -> None:
    """Removes harness folders: each node's folder in one holds a copy of the image (some 100,000 files), so the
    nodes' folders go side by side, not one by one."""
    removals = [subprocess.Popen(["rm", "-rf", str(node)]) for folder in folders for node in folder.glob("*")]
    for removal in removals:
        removal.wait()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


IMAGE_COPY_BYTES = 7 * 1024**3
"""Each node engine holds a copy of the image (about 6.7 GB)."""


@contextlib.contextmanager
def started_cluster(
    count: int = 2, spares: int = 0, network: Network = Network(), reserve: int = 0
) -> Iterator[Cluster]:
    """A fresh harness of `count` test hosts and `spares` more on `network`, refused up front when the disk cannot hold
    their copies of the image, `reserve` bytes more and 2 GB to spare; removed however the block ends."""
    harness = Cluster(network.folder / uuid.uuid4().hex[:8], network)
    harness.teardown_leftovers()  # a killed run's test hosts hold image copies too
    TEST_ROOT.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(TEST_ROOT).free
    needed = (count + spares) * IMAGE_COPY_BYTES + reserve + 2 * 1024**3
    if free < needed:
        raise RuntimeError(
            f"the test hosts need {needed / 1024**3:.0f} GiB free under {TEST_ROOT}, only "
            f"{free / 1024**3:.1f} GiB is: free disk space (docker image prune, old checkouts)"
        )
    try:
        harness.start(count=count, spares=spares)
        yield harness
    finally:
        harness.stop()
