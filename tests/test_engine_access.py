"""How the launcher reaches a node's engine (launcher/host/planning/access.py): the per-node keys, TLS from the Docker
CLI's variables through docker-py, an engine others could read refused unless allowed, and the one line of each TLS
failure; then the real thing: `launcher status` through a TLS front of this machine's engine (tests/tlsengine.py) with
this machine's client certificate, and with one of another CA, which the engine refuses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from docker.api.client import APIClient
from docker.errors import NotFound
from docker.tls import TLSConfig

from launcher import cli
from launcher.core.options import SettingsError
from launcher.host.engines import reach
from launcher.host.engines.docker_driver import NodeDriver
from launcher.host.engines.node_engine import NodeError
from launcher.host.planning import access
from launcher.host.planning.access import EngineTls, Setting, exposure, insecure_allowed, node_key, node_setting
from launcher.host.planning.plan import ClusterPlan, Node
from launcher.host.planning.settings import resolve_settings
from tests import tlsengine

REPO = Path(__file__).resolve().parents[1]
FAR = "tcp://192.0.2.10:2375"
"""A plain engine off this machine (TEST-NET-1: nothing answers there)."""


@pytest.mark.parametrize(
    "key, node, expected",
    [
        ("DOCKER_HOST", "node_2", "DOCKER_HOST_NODE_2"),
        ("DOCKER_TLS_VERIFY", "gpu-box.lan", "DOCKER_TLS_VERIFY_GPU_BOX_LAN"),
        ("DOCKER_CERT_PATH", "n1", "DOCKER_CERT_PATH_N1"),
    ],
)
def test_per_node_keys_follow_one_naming(key, node, expected):
    assert node_key(key, node) == expected


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({}, None),
        ({"DOCKER_TLS_VERIFY": "1"}, Setting("DOCKER_TLS_VERIFY", "1")),
        ({"DOCKER_TLS_VERIFY": "1", "DOCKER_TLS_VERIFY_NODE_2": "1"}, Setting("DOCKER_TLS_VERIFY_NODE_2", "1")),
        ({"DOCKER_TLS_VERIFY": "1", "DOCKER_TLS_VERIFY_NODE_2": ""}, Setting("DOCKER_TLS_VERIFY_NODE_2", "")),
        ({"DOCKER_TLS_VERIFY_NODE_3": "1"}, None),
    ],
)
def test_a_nodes_own_key_wins_over_the_one_for_every_node_even_empty(keys, expected):
    assert node_setting(keys, "DOCKER_TLS_VERIFY", "node_2") == expected


@pytest.mark.parametrize(
    "url, tls, expected",
    [
        ("tcp://10.0.0.2:2375", None, "plain TCP, unencrypted"),
        (
            "tcp://gpu-2.lan:2376",
            TLSConfig(verify=False),
            "TLS without DOCKER_TLS_VERIFY: the engine's certificate is not checked",
        ),
        ("tcp://gpu-2.lan:2376", TLSConfig(verify=True), None),
        ("tcp://127.0.0.1:2375", None, None),
        ("tcp://127.0.0.2:2375", None, None),
        ("tcp://localhost:2375", None, None),
        ("tcp://[::1]:2375", None, None),
        ("http://10.0.0.2:2375", None, "plain TCP, unencrypted"),
        ("ssh://admin@10.0.0.2", None, None),
        ("unix:///run/node2.sock", None, None),
    ],
)
def test_only_engines_others_could_read_are_exposed(url, tls, expected):
    assert exposure(url, tls) == expected


@pytest.mark.parametrize(
    "keys, flag, expected",
    [
        ({}, False, False),
        ({}, True, True),
        ({"INSECURE_ENGINES": "1"}, False, True),
        ({"INSECURE_ENGINES": "yes"}, False, True),
        ({"INSECURE_ENGINES": "0"}, False, False),
        ({"INSECURE_ENGINES": ""}, True, True),
        ({"INSECURE_ENGINES": "maybe"}, False, "INSECURE_ENGINES='maybe' is neither 1 nor 0"),
    ],
)
def test_insecure_engines_flag_or_key(keys, flag, expected):
    if isinstance(expected, str):
        with pytest.raises(SettingsError, match=expected):
            insecure_allowed(keys, flag)
    else:
        assert insecure_allowed(keys, flag) is expected


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A CA, a client certificate of it in client/, one of another CA in stranger/ (which trusts the right CA)."""
    root = tmp_path_factory.mktemp("pki")
    ca, other = tlsengine.make_ca(root / "ca", "test-ca"), tlsengine.make_ca(root / "other-ca", "other-ca")
    server = f"subjectAltName=IP:{tlsengine.ADDRESS}\nextendedKeyUsage=serverAuth"
    tlsengine.issue(ca, root / "server", "engine", server)
    tlsengine.issue(ca, root / "client", "launcher", "extendedKeyUsage=clientAuth")
    tlsengine.issue(other, root / "stranger", "launcher", "extendedKeyUsage=clientAuth", trusted_ca=ca)
    return root


def settings_of(env: dict[str, str], environ: dict[str, str] | None = None, insecure: bool = False):
    return resolve_settings(env, nodes="node_1,node_2", environ=environ or {}, insecure_engines=insecure)


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {"DOCKER_HOST_NODE_2": FAR},
            "node_2: its engine tcp://192.0.2.10:2375 is plain TCP, unencrypted, so the "
            "cluster's private key, the job's settings, registry credentials for pulls and the "
            "workdir would cross the network readable by others; set up TLS",
        ),
        (
            {"DOCKER_HOST_NODE_2": "tcp://10.0.0.2:2376", "DOCKER_CERT_PATH": "{certs}/client"},
            "node_2: its engine tcp://10.0.0.2:2376 is TLS without DOCKER_TLS_VERIFY: the engine's certificate is not "
            "checked, so",
        ),
        (
            {
                "DOCKER_HOST_NODE_2": "tcp://10.0.0.2:2376",
                "DOCKER_TLS_VERIFY": "1",
                "DOCKER_CERT_PATH": "{certs}/nowhere",
            },
            "node_2: TLS certificate folder {certs}/nowhere (DOCKER_CERT_PATH) does not exist: put this machine's "
            "client "
            "certificate there",
        ),
        (
            {
                "DOCKER_HOST_NODE_2": "tcp://10.0.0.2:2376",
                "DOCKER_TLS_VERIFY_NODE_2": "1",
                "DOCKER_CERT_PATH_NODE_2": "{certs}/ca",
            },
            "node_2: TLS certificate folder {certs}/ca (DOCKER_CERT_PATH_NODE_2) has no cert.pem, key.pem",
        ),
        (
            {"DOCKER_TLS_VERIFY_NODE_1": "1"},
            "DOCKER_TLS_VERIFY_NODE_1 is set, but node_1's engine is ssh://node_1, which "
            "takes no TLS: point DOCKER_HOST_NODE_1 at its TLS port",
        ),
    ],
)
def test_engines_are_refused_before_any_connection(certs, env, expected):
    env = {key: value.format(certs=certs) for key, value in env.items()}
    with pytest.raises(SettingsError) as refused:
        settings_of(env)
    assert str(refused.value).startswith(expected.format(certs=certs)) and "\n" not in str(refused.value)


def test_tls_from_the_docker_clis_variables_reaches_the_node(certs):
    env = {"DOCKER_HOST_NODE_2": "tcp://10.0.0.2:2376", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(certs / "x")}
    # The environment wins over .env; a node's own key over the one for every node.
    settings = settings_of(env, environ={"DOCKER_CERT_PATH_NODE_2": str(certs / "client")})
    node = ClusterPlan.of(settings).nodes[1]
    options = access.client_options(node.engine_url, node.tls)
    assert options["base_url"] == "tcp://10.0.0.2:2376" and options["tls"].verify is True
    assert options["tls"].cert == (str(certs / "client/cert.pem"), str(certs / "client/key.pem"))
    assert options["tls"].ca_cert == str(certs / "client/ca.pem")
    assert settings.exposed_engines() == {}
    assert access.client_options("ssh://node_1", EngineTls(Setting("DOCKER_TLS_VERIFY", "1"))) == {
        "base_url": "ssh://node_1"
    }


def test_allowed_insecure_engines_are_named_in_one_warning(certs):
    env = {
        "DOCKER_HOST_NODE_1": "tcp://127.0.0.1:2375",
        "DOCKER_HOST_NODE_2": FAR,
        "DOCKER_TLS_VERIFY": "1",
        "DOCKER_CERT_PATH": str(certs / "client"),
        "DOCKER_TLS_VERIFY_NODE_2": "",
        "DOCKER_CERT_PATH_NODE_2": "",
    }
    for settings in (settings_of(env, insecure=True), settings_of({**env, "INSECURE_ENGINES": "1"})):
        assert settings.exposed_engines() == {"node_2": (FAR, "plain TCP, unencrypted")}
    assert access.warning(settings.exposed_engines()) == (
        "warning: --insecure-engine: node_2 at tcp://192.0.2.10:2375 (plain TCP, unencrypted): the cluster's private "
        "key, the job's settings, registry credentials for pulls and the workdir cross the network unencrypted or to "
        "an unchecked engine, readable by anyone on the way; set up TLS (docs/multi-host.md, Engines over TCP)"
    )
    assert access.warning({}) is None


URL = "tcp://gpu-2:2376"


@pytest.mark.parametrize(
    "said, folder, expected",
    [
        (
            "Error while fetching server API version: HTTPSConnectionPool(host='gpu-2', port=2376): Max retries "
            "exceeded "
            "with url: /version (Caused by SSLError(SSLError(1, '[SSL: WRONG_VERSION_NUMBER] wrong version number "
            "(_ssl.c:1006)')))",
            "/c",
            "its engine at tcp://gpu-2:2376 answers in plain HTTP, not TLS (wrong version number): start its "
            "dockerd with "
            "--tlsverify (docs/multi-host.md, Engines over TCP), or set DOCKER_TLS_VERIFY_GPU_2= and "
            "DOCKER_CERT_PATH_GPU_2= (empty) to reach it without TLS (--insecure-engine off this machine)",
        ),
        (
            "(Caused by SSLError(SSLError(1, '[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca (_ssl.c:2580)')))",
            "/c",
            "its engine refused this machine's client certificate /c/cert.pem (tlsv1 alert unknown ca): use one "
            "signed by "
            "the CA the engine's --tlscacert names (or point DOCKER_CERT_PATH_GPU_2 at the folder that has one)",
        ),
        (
            "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required (_ssl.c:2580)",
            "/c",
            "its engine refused this machine's client certificate /c/cert.pem (tlsv13 alert certificate required)",
        ),
        (
            "(Caused by SSLError(SSLEOFError(8, 'EOF occurred in violation of protocol (_ssl.c:2427)')))",
            "/c",
            "its engine at tcp://gpu-2:2376 ended the TLS handshake (EOF occurred in violation of protocol): it did "
            "not "
            "accept the client certificate /c/cert.pem",
        ),
        (
            "SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed "
            "certificate in certificate chain (_ssl.c:1006)')",
            "/c",
            "its engine's certificate is not signed by the CA in /c/ca.pem (certificate verify failed: self-signed "
            "certificate in certificate chain): put the CA that signed the engine's --tlscert there",
        ),
        (
            'SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address '
            "mismatch, certificate is not valid for '10.0.0.2'. (_ssl.c:1006)\")",
            "/c",
            "its engine's certificate does not name the host in tcp://gpu-2:2376 (certificate verify failed: IP "
            "address "
            "mismatch, certificate is not valid for",
        ),
        (
            "SSLError(116, '[X509: KEY_VALUES_MISMATCH] key values mismatch (_ssl.c:3926)')",
            "/c",
            "/c/cert.pem and key.pem are not a pair (key values mismatch)",
        ),
        (
            "SSLError(136, '[X509: NO_CERTIFICATE_OR_CRL_FOUND] no certificate or crl found (_ssl.c:4154)')",
            "/c",
            "a file in /c is not a PEM certificate or key (no certificate or crl found)",
        ),
        (
            '400 Client Error for http://gpu-2:2376/version: Bad Request ("Client sent an HTTP request to an HTTPS '
            'server.")',
            None,
            "its engine at tcp://gpu-2:2376 speaks TLS, but no TLS was asked for: set DOCKER_TLS_VERIFY_GPU_2=1 and "
            "DOCKER_CERT_PATH_GPU_2",
        ),
        ("('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))", None, None),
        ("Error while fetching server API version: 500 Server Error", "/c", None),
    ],
)
def test_each_tls_failure_is_one_line_with_its_fix(said, folder, expected):
    line = reach.tls_failure("gpu-2", URL, said, folder)
    if expected is None:
        assert line is None
    else:
        assert line is not None and line.startswith(expected) and "\n" not in line


def test_the_engines_ca_wins_over_requests_ca_bundle_variables(monkeypatch):
    import launcher.host.engines.docker_sdk  # noqa: F401  (patches docker-py's client)

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    client = APIClient(base_url="tcp://127.0.0.1:1", version="1.41", tls=False)
    client.verify = "/certs/ca.pem"
    assert client.merge_environment_settings("https://127.0.0.1:1", {}, False, None, None)["verify"] == "/certs/ca.pem"
    assert client.merge_environment_settings("https://127.0.0.1:1", {}, False, False, None)["verify"] is False


def launcher(*args: str, **environ: str) -> subprocess.CompletedProcess:
    """This checkout's launcher (its own code, whichever checkout the environment's package points at)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DOCKER_", "INSECURE_"))}
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        cwd=REPO,
        env={**env, **environ},
        capture_output=True,
        text=True,
        timeout=120,
    )


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def test_a_plain_engine_off_this_machine_is_refused_before_any_connection(tmp_path):
    started = time.monotonic()
    refused = launcher("status", "--nodes", "node_2", DOCKER_HOST_NODE_2=FAR)
    assert refused.returncode == 2 and time.monotonic() - started < 10
    [line] = error_lines(refused)
    assert line.startswith(
        "error: node_2: its engine tcp://192.0.2.10:2375 is plain TCP, unencrypted, so the cluster's private key"
    ) and line.endswith("or pass --insecure-engine (INSECURE_ENGINES=1 in .env) on a network you trust"), line
    assert "connecting to" not in refused.stderr
    env_file = tmp_path / "launcher.env"
    env_file.write_text(f"DOCKER_HOST_NODE_2={FAR}\nCONNECT_TIMEOUT=1\n")
    allowed = launcher("status", "--env-file", str(env_file), "--nodes", "node_2", "--insecure-engine")
    warnings = [line for line in allowed.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [access.warning({"node_2": (FAR, "plain TCP, unencrypted")})]
    assert allowed.returncode == 1
    assert error_lines(allowed)[0].startswith("error: node_2: cannot reach its Docker engine")


@pytest.mark.integration
def test_a_tls_engine_answers_with_this_machines_certificate_and_refuses_another_cas(certs):
    node = "node_1"
    tls = {"DOCKER_TLS_VERIFY_NODE_1": "1", "REQUESTS_CA_BUNDLE": str(certs / "other-ca/ca.pem")}
    with (
        tlsengine.EngineFront(tlsengine.server_context(certs / "server")) as front,
        tlsengine.EngineFront(None) as plain,
    ):
        answered = launcher(
            "status",
            "--nodes",
            node,
            DOCKER_HOST_NODE_1=front.url,
            DOCKER_CERT_PATH_NODE_1=str(certs / "client"),
            **tls,
        )
        assert answered.returncode == 0 and error_lines(answered) == [], answered.stderr[-2000:]
        # (The launcher's bounded TCP probe comes first: a connection that closes before any handshake.)
        assert [why for why in front.refused if "EOF" not in why] == []

        stranger = launcher(
            "status",
            "--nodes",
            node,
            DOCKER_HOST_NODE_1=front.url,
            DOCKER_CERT_PATH_NODE_1=str(certs / "stranger"),
            **tls,
        )
        assert stranger.returncode == 1
        [line] = error_lines(stranger)
        assert line == (
            f"error: node_1: its engine refused this machine's client certificate {certs}/stranger/"
            "cert.pem (tlsv1 alert unknown ca): use one signed by the CA the engine's --tlscacert names "
            "(or point DOCKER_CERT_PATH_NODE_1 at the folder that has one)"
        ), line
        assert "certificate verify failed" in front.refused[-1]  # the engine's side: a client certificate it refused

        not_tls = launcher(
            "status",
            "--nodes",
            node,
            DOCKER_HOST_NODE_1=plain.url,
            DOCKER_CERT_PATH_NODE_1=str(certs / "client"),
            **tls,
        )
        assert not_tls.returncode == 1
        assert error_lines(not_tls) == [
            f"error: node_1: its engine at {plain.url} answers in plain HTTP, not TLS "
            "(wrong version number): start its dockerd with --tlsverify (docs/multi-host."
            "md, Engines over TCP), or set DOCKER_TLS_VERIFY_NODE_1= and "
            "DOCKER_CERT_PATH_NODE_1= (empty) to reach it without TLS (--insecure-engine "
            "off this machine)"
        ]


class ListedThenGone:
    """A Docker client whose listing names two containers, one of them removed before it is inspected."""

    class api:  # noqa: N801 - the SDK's attribute name
        @staticmethod
        def containers(all: bool, filters: dict) -> list[dict]:  # noqa: A002 - the SDK's keyword
            return [{"Id": "gone"}, {"Id": "kept"}]

    class containers:  # noqa: N801 - the SDK's attribute name
        @staticmethod
        def get(container_id: str) -> SimpleNamespace:
            if container_id == "gone":
                raise NotFound("No such container: gone")
            state = {"Status": "running", "ExitCode": 0}
            return SimpleNamespace(id="kept", name="kept", labels={}, status="running", attrs={"State": state})


def test_a_container_removed_while_the_node_is_listed_is_left_out():
    driver = NodeDriver(Node("node_1", "ssh://node_1"), ListedThenGone())  # type: ignore[arg-type]
    assert [container.id for container in driver.cluster_containers()] == ["kept"]


def test_an_engine_failing_a_request_ends_any_command_in_one_line(monkeypatch, capsys):
    def failing_app() -> None:
        raise NodeError("node_1", "its Docker engine failed a request (404: Not Found)")

    monkeypatch.setattr(cli, "app", failing_app)
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == 1
    assert capsys.readouterr().err == "error: node_1: its Docker engine failed a request (404: Not Found)\n"
