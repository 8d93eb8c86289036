"""The Pod Security Standards' checks (launcher/k8s/podsecurity.py), rule by rule, as Kubernetes documents the
baseline and restricted profiles (https://kubernetes.io/docs/concepts/security/pod-security-standards/): a pod that
passes restricted, then one change per rule, and the strictest profile the changed pod still passes."""

from __future__ import annotations

import copy

import pytest

from launcher.k8s import podsecurity


def strictest_profile(pod: dict) -> str:
    """The strictest profile the pod spec passes."""
    return next(profile for profile in reversed(podsecurity.PROFILES) if not podsecurity.violations(pod, profile))


def restricted_pod() -> dict:
    return {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "main",
                "image": "registry.example.com/i:1",
                "ports": [{"containerPort": 22}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "c"}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
        ],
    }


def container(pod: dict) -> dict:
    return pod["containers"][0]["securityContext"]


RULES = {
    # baseline
    "host process": (
        lambda pod: pod["securityContext"].update(windowsOptions={"hostProcess": True}),
        "privileged",
        "HostProcess",
    ),
    "host network": (lambda pod: pod.update(hostNetwork=True), "privileged", "hostNetwork must be unset or false"),
    "host PID": (lambda pod: pod.update(hostPID=True), "privileged", "hostPID"),
    "host IPC": (lambda pod: pod.update(hostIPC=True), "privileged", "hostIPC"),
    "privileged container": (lambda pod: container(pod).update(privileged=True), "privileged", "privileged must be"),
    "SYS_PTRACE added": (
        lambda pod: container(pod)["capabilities"].update(add=["SYS_PTRACE"]),
        "privileged",
        "capabilities.add ['SYS_PTRACE'] is beyond the baseline set",
    ),
    "IPC_LOCK added": (
        lambda pod: container(pod)["capabilities"].update(add=["IPC_LOCK"]),
        "privileged",
        "capabilities.add ['IPC_LOCK']",
    ),
    "hostPath volume": (
        lambda pod: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "privileged",
        "volume h is a hostPath",
    ),
    "host port": (lambda pod: pod["containers"][0]["ports"][0].update(hostPort=22), "privileged", "hostPort"),
    "AppArmor unconfined": (
        lambda pod: container(pod).update(appArmorProfile={"type": "Unconfined"}),
        "privileged",
        "appArmorProfile.type Unconfined",
    ),
    "SELinux user": (
        lambda pod: pod["securityContext"].update(seLinuxOptions={"user": "root"}),
        "privileged",
        "seLinuxOptions",
    ),
    "SELinux type": (
        lambda pod: container(pod).update(seLinuxOptions={"type": "spc_t"}),
        "privileged",
        "seLinuxOptions",
    ),
    "unmasked /proc": (lambda pod: container(pod).update(procMount="Unmasked"), "privileged", "procMount"),
    "seccomp unconfined": (
        lambda pod: pod["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "privileged",
        "must not be Unconfined",
    ),
    "unsafe sysctl": (
        lambda pod: pod["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        "privileged",
        "sysctls ['kernel.msgmax']",
    ),
    # restricted only
    "a hostPath-free but forbidden volume type": (
        lambda pod: pod["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
        "baseline",
        "volume n is of a type restricted forbids",
    ),
    "privilege escalation allowed": (
        lambda pod: container(pod).pop("allowPrivilegeEscalation"),
        "baseline",
        "allowPrivilegeEscalation must be false",
    ),
    "may run as root": (
        lambda pod: pod["securityContext"].pop("runAsNonRoot"),
        "baseline",
        "runAsNonRoot must be true",
    ),
    "container says root is fine": (
        lambda pod: container(pod).update(runAsNonRoot=False),
        "baseline",
        "runAsNonRoot must be true",
    ),
    "uid 0": (lambda pod: container(pod).update(runAsUser=0), "baseline", "runAsUser must not be 0"),
    "no seccomp profile": (
        lambda pod: pod["securityContext"].pop("seccompProfile"),
        "baseline",
        "seccompProfile.type must be RuntimeDefault or Localhost",
    ),
    "capabilities not dropped": (
        lambda pod: container(pod)["capabilities"].pop("drop"),
        "baseline",
        "capabilities.drop must include ALL",
    ),
    "a baseline capability added": (
        lambda pod: container(pod)["capabilities"].update(add=["CHOWN"]),
        "baseline",
        "restricted allows NET_BIND_SERVICE only",
    ),
    # allowed by restricted
    "NET_BIND_SERVICE added": (
        lambda pod: container(pod)["capabilities"].update(add=["NET_BIND_SERVICE"]),
        "restricted",
        None,
    ),
    "seccomp per container": (
        lambda pod: (
            pod["securityContext"].pop("seccompProfile"),
            container(pod).update(seccompProfile={"type": "Localhost"}),
        ),
        "restricted",
        None,
    ),
    "a safe sysctl": (
        lambda pod: pod["securityContext"].update(
            sysctls=[{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"}]
        ),
        "restricted",
        None,
    ),
}


@pytest.mark.parametrize("change,strictest,message", RULES.values(), ids=RULES.keys())
def test_each_documented_rule(change, strictest, message):
    pod = restricted_pod()
    change(pod)
    assert strictest_profile(pod) == strictest
    broken = podsecurity.violations(pod, "restricted" if strictest == "baseline" else "baseline")
    if message is None:
        assert broken == []
    else:
        assert any(message in line for line in broken), broken


def test_a_pod_that_passes_restricted_and_an_empty_one_that_passes_baseline_only():
    assert strictest_profile(restricted_pod()) == "restricted"
    assert podsecurity.violations({"containers": [{"name": "c"}]}, "baseline") == []
    assert strictest_profile({"containers": [{"name": "c"}]}) == "baseline"
    assert podsecurity.violations(copy.deepcopy(restricted_pod()), "privileged") == []
    with pytest.raises(ValueError, match="no Pod Security profile 'strict'"):
        podsecurity.violations({}, "strict")


def test_init_and_ephemeral_containers_count_too():
    pod = restricted_pod()
    pod["initContainers"] = [{"name": "init", "securityContext": {"privileged": True}}]
    assert any("container init: privileged" in line for line in podsecurity.violations(pod, "baseline"))
