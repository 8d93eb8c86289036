"""How the launcher reaches each node's engine; every command that connects (start, stop, status, results, stacks,
logs, doctor) goes through here and docker_driver.NodeDriver.connect. The address is ssh://NODE unless
DOCKER_HOST_<NODE> overrides it; a tcp:// engine takes the Docker CLI's TLS variables, DOCKER_TLS_VERIFY and
DOCKER_CERT_PATH (a folder with ca.pem, cert.pem and key.pem; ~/.docker by default), each also per node where the
nodes differ (DOCKER_TLS_VERIFY_<NODE>, DOCKER_CERT_PATH_<NODE>; the node's own key wins, even empty), from this
machine's environment or .env (the environment wins). docker-py's kwargs_from_env reads them as the Docker tools do
and makes the TLS configuration: nothing here speaks TLS itself.

An engine whose traffic others could read on the way (plain tcp://, or TLS that does not check the engine's
certificate) is refused on any address but loopback unless the user allows it (--insecure-engine, INSECURE_ENGINES=1),
and is then named in one warning: the cluster's private key, the job's settings, registry credentials for pulls and
the workdir cross that link. The decisions are pure (node_setting, exposure, the wording); tls_config reads the
certificate folder.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from docker.errors import TLSParameterError
from docker.tls import TLSConfig
from docker.utils import kwargs_from_env

from launcher.core.options import SettingsError

ENGINE = "DOCKER_HOST"
TLS_VERIFY = "DOCKER_TLS_VERIFY"
CERT_PATH = "DOCKER_CERT_PATH"
INSECURE_ENGINES = "INSECURE_ENGINES"
INSECURE_FLAG = "--insecure-engine"
CERT_FILES = ("ca.pem", "cert.pem", "key.pem")
NETWORK_SCHEMES = ("tcp", "http", "https")
DEFAULT_CERT_PATH = "~/.docker"
EXPOSED = "the cluster's private key, the job's settings, registry credentials for pulls and the workdir"
"""What crosses the link to a node's engine during a start."""
TLS_DOCS = "docs/multi-host.md, Engines over TCP"
CONNECT_TIMEOUT_S = 10.0
"""How long a connection to a node may take before the launcher gives up on it (CONNECT_TIMEOUT in .env)."""
TRUE, FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def node_key(key: str, node: str) -> str:
    """KEY for one node: the node name upper-cased, other characters as _ (DOCKER_HOST_NODE_2 for node_2)."""
    return f"{key}_{re.sub(r'[^A-Za-z0-9]', '_', node).upper()}"


def engine_override_key(node: str) -> str:
    """The key that overrides how NODE's engine is reached, e.g. DOCKER_HOST_NODE_2 for node_2."""
    return node_key(ENGINE, node)


@dataclass(frozen=True)
class Setting:
    """One TLS variable for one node, with the key that set it (for the messages)."""

    key: str
    value: str


def node_setting(keys: Mapping[str, str], key: str, node: str) -> Setting | None:
    """NODE's KEY: its own (KEY_<NODE>) wins over the one for every node (KEY), even when empty; None: neither."""
    for name in (node_key(key, node), key):
        if name in keys:
            return Setting(name, keys[name])
    return None


@dataclass(frozen=True)
class EngineTls:
    """The Docker CLI's TLS variables for one node's engine; None where neither key is set."""

    verify: Setting | None = None
    cert_path: Setting | None = None

    @classmethod
    def of(cls, keys: Mapping[str, str], node: str) -> EngineTls:
        return cls(node_setting(keys, TLS_VERIFY, node), node_setting(keys, CERT_PATH, node))

    def environment(self, url: str) -> dict[str, str]:
        """The variables as docker-py's kwargs_from_env reads them (DOCKER_HOST always set: an empty mapping would
        make it read this process's environment)."""
        env = {ENGINE: url}
        if self.verify is not None:
            env[TLS_VERIFY] = self.verify.value
        if self.cert_path is not None:
            env[CERT_PATH] = os.path.expanduser(self.cert_path.value)
        return env

    def own_keys(self, node: str) -> list[str]:
        """The node's own keys among those set (KEY_<NODE>), which only a network engine takes."""
        own = (node_key(TLS_VERIFY, node), node_key(CERT_PATH, node))
        return [setting.key for setting in (self.verify, self.cert_path) if setting and setting.key in own]

    def folder(self) -> tuple[str, str]:
        """(the certificate folder, what set it), as kwargs_from_env picks it: ~/.docker where no key names one."""
        if self.cert_path is not None and self.cert_path.value:
            return os.path.expanduser(self.cert_path.value), self.cert_path.key
        return os.path.expanduser(DEFAULT_CERT_PATH), f"{CERT_PATH}'s default"


def is_network(url: str) -> bool:
    return urlsplit(url).scheme in NETWORK_SCHEMES


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def insecure_allowed(keys: Mapping[str, str], flag: bool) -> bool:
    """--insecure-engine, or INSECURE_ENGINES in the environment or .env (1/true/yes/on; 0/false/no/off or empty:
    not allowed)."""
    raw = keys.get(INSECURE_ENGINES, "").strip().lower()
    if raw not in TRUE + FALSE:
        raise SettingsError(
            f"{INSECURE_ENGINES}={keys[INSECURE_ENGINES]!r} is neither 1 nor 0: write {INSECURE_ENGINES}=1 to allow "
            f"plain tcp:// engines off this machine, or drop it"
        )
    return flag or raw in TRUE


def client_options(url: str, tls: EngineTls | None) -> dict[str, Any]:
    """docker.DockerClient's base_url and tls for the engine at `url`, as kwargs_from_env makes them from the Docker
    CLI's variables (raises docker's TLSParameterError where a certificate file is missing)."""
    if tls is None or not is_network(url):
        return {"base_url": url}
    return kwargs_from_env(environment=tls.environment(url))


def exposure(url: str, tls: TLSConfig | None) -> str | None:
    """Why others on the network could read the traffic to the engine at `url`; None where they cannot: TLS that
    checks the engine's certificate, a loopback address, a unix:// or ssh:// engine."""
    parts = urlsplit(url)
    if parts.scheme not in NETWORK_SCHEMES or is_loopback(parts.hostname or ""):
        return None
    if tls is None:
        return "plain TCP, unencrypted"
    if not tls.verify:
        return f"TLS without {TLS_VERIFY}: the engine's certificate is not checked"
    return None


def refusal(node: str, url: str, why: str) -> str:
    """What the launcher says, before connecting, of an engine whose traffic others could read."""
    return (
        f"{node}: its engine {url} is {why}, so {EXPOSED} would cross the network readable by others; set up TLS "
        f"({TLS_VERIFY}=1 and {CERT_PATH}, or {node_key(TLS_VERIFY, node)} and {node_key(CERT_PATH, node)} for this "
        f"node: {TLS_DOCS}), reach it over ssh://, or pass {INSECURE_FLAG} ({INSECURE_ENGINES}=1 in .env) on a "
        "network you trust"
    )


def warning(exposed: Mapping[str, tuple[str, str]]) -> str | None:
    """The one warning of a command that uses engines others could read ({node: (url, why)}); None for none."""
    if not exposed:
        return None
    nodes = "; ".join(f"{node} at {url} ({why})" for node, (url, why) in exposed.items())
    return (
        f"warning: {INSECURE_FLAG}: {nodes}: {EXPOSED} cross the network unencrypted or to an unchecked engine, "
        f"readable by anyone on the way; set up TLS ({TLS_DOCS})"
    )


def misplaced(node: str, url: str, tls: EngineTls) -> str | None:
    """A node's own TLS key where its engine is not a tcp:// one (ssh:// and unix:// engines take no TLS)."""
    own = tls.own_keys(node)
    if not own or is_network(url):
        return None
    return (
        f"{own[0]} is set, but {node}'s engine is {url}, which takes no TLS: point {engine_override_key(node)} at its "
        f"TLS port (tcp://HOST:2376), or drop {own[0]}"
    )


def folder_problem(node: str, folder: str, source: str, missing: list[str]) -> str:
    """What a certificate folder that kwargs_from_env refused lacks, and the fix."""
    fix = (
        f"put this machine's client certificate there (cert.pem, key.pem, and ca.pem, the CA that signed the "
        f"engine's certificate), or point {node_key(CERT_PATH, node)} at the folder that holds them"
    )
    if not Path(folder).is_dir():
        return f"{node}: TLS certificate folder {folder} ({source}) does not exist: {fix}"
    return f"{node}: TLS certificate folder {folder} ({source}) has no {', '.join(missing) or 'usable files'}: {fix}"


def tls_config(node: str, url: str, tls: EngineTls | None) -> TLSConfig | None:
    """The TLS configuration docker-py will use for the node's engine (None: plain), its files there and readable;
    raises SettingsError with the one line to show where they are not."""
    try:
        config = client_options(url, tls).get("tls")
    except TLSParameterError:
        assert tls is not None
        folder, source = tls.folder()
        missing = [name for name in CERT_FILES if not os.path.isfile(os.path.join(folder, name))]
        raise SettingsError(folder_problem(node, folder, source, missing)) from None
    if not isinstance(config, TLSConfig):
        return None
    files = [*(config.cert or ()), *([config.ca_cert] if config.verify and config.ca_cert else [])]
    for path in files:
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            raise SettingsError(
                f"{node}: cannot read {path} ({error.strerror}): give this user read access to it (chmod 600 for the "
                "key, as its owner), or run the launcher as the user who owns it"
            ) from None
    return config
