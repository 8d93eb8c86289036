"""Kubernetes' Pod Security Standards, as https://kubernetes.io/docs/concepts/security/pod-security-standards/
documents them (the rules of the `baseline` and `restricted` profiles, policy version v1.33): which rules a pod spec
breaks. Pure: a pod spec (a dict, as in a pod template) in, one line per broken rule out.

`launcher export mpijob` checks each pod it writes against the profile it was asked for (--pod-security), and the
tests check the same function against the documented rules, rule by rule. Pod metadata (the AppArmor annotations
of older clusters) is not a pod spec's and is not checked; the export writes none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

PROFILES = ("privileged", "baseline", "restricted")
"""The three levels, loosest first; a namespace enforces one (label pod-security.kubernetes.io/enforce)."""

BASELINE_CAPABILITIES = frozenset(
    "AUDIT_WRITE CHOWN DAC_OVERRIDE FOWNER FSETID KILL MKNOD NET_BIND_SERVICE SETFCAP SETGID SETPCAP SETUID "
    "SYS_CHROOT".split()
)
"""Capabilities baseline lets a container add (the container runtime's defaults)."""
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    "kernel.shm_rmid_forced net.ipv4.ip_local_port_range net.ipv4.ip_unprivileged_port_start net.ipv4.tcp_syncookies "
    "net.ipv4.ping_group_range net.ipv4.ip_local_reserved_ports net.ipv4.tcp_keepalive_time net.ipv4.tcp_fin_timeout "
    "net.ipv4.tcp_keepalive_intvl net.ipv4.tcp_keepalive_probes".split()
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset(
    "configMap csi downwardAPI emptyDir ephemeral persistentVolumeClaim projected secret".split()
)
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in CONTAINER_LISTS:
        yield from pod.get(key) or ()


def _contexts(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(where, securityContext) for the pod and every container."""
    yield "the pod", pod.get("securityContext") or {}
    for container in containers(pod):
        yield f"container {container.get('name', '?')}", container.get("securityContext") or {}


def baseline_violations(pod: Mapping[str, Any]) -> list[str]:
    """The baseline profile's rules this pod spec breaks (it prevents known privilege escalations)."""
    found = []
    for where, context in _contexts(pod):
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"{where}: HostProcess (windowsOptions.hostProcess) must be unset or false")
        if context.get("privileged"):
            found.append(f"{where}: privileged must be unset or false")
        added = set((context.get("capabilities") or {}).get("add") or ()) - BASELINE_CAPABILITIES
        if added:
            found.append(f"{where}: capabilities.add {sorted(added)} is beyond the baseline set")
        apparmor = (context.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"{where}: appArmorProfile.type {apparmor} must be RuntimeDefault or Localhost")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"{where}: seLinuxOptions must leave user and role unset and use a container type")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{where}: procMount must be Default")
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"{where}: seccompProfile.type must not be Unconfined")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"the pod: {field} must be unset or false")
    found += [
        f"the pod: volume {volume.get('name')} is a hostPath"
        for volume in pod.get("volumes") or ()
        if "hostPath" in volume
    ]
    for container in containers(pod):
        if any(port.get("hostPort") for port in container.get("ports") or ()):
            found.append(f"container {container.get('name', '?')}: hostPort must be unset or 0")
    unsafe = [
        item.get("name")
        for item in (pod.get("securityContext") or {}).get("sysctls") or ()
        if item.get("name") not in SAFE_SYSCTLS
    ]
    if unsafe:
        found.append(f"the pod: sysctls {unsafe} are not in the safe set")
    return found


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """The restricted profile's rules this pod spec breaks: baseline's, and pod hardening best practice."""
    found = baseline_violations(pod)
    pod_context = pod.get("securityContext") or {}
    found += [
        f"the pod: volume {volume.get('name')} is of a type restricted forbids"
        for volume in pod.get("volumes") or ()
        if not set(volume) - {"name"} <= RESTRICTED_VOLUMES
    ]
    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    if pod_context.get("runAsUser") == 0:
        found.append("the pod: runAsUser must not be 0")
    for container in containers(pod):
        where = f"container {container.get('name', '?')}"
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation must be false")
        non_root = context.get("runAsNonRoot")
        if non_root is False or not (pod_non_root or non_root is True):
            found.append(f"{where}: runAsNonRoot must be true (in the pod's or the container's securityContext)")
        if context.get("runAsUser") == 0:
            found.append(f"{where}: runAsUser must not be 0")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if not (seccomp in ("RuntimeDefault", "Localhost") or (seccomp is None and pod_seccomp)):
            found.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (pod or container)")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or ()):
            found.append(f"{where}: capabilities.drop must include ALL")
        added = set(capabilities.get("add") or ()) - RESTRICTED_CAPABILITIES
        if added:
            found.append(f"{where}: capabilities.add {sorted(added)}: restricted allows NET_BIND_SERVICE only")
    return found


def violations(pod: Mapping[str, Any], profile: str) -> list[str]:
    """The rules of `profile` (PROFILES) that the pod spec breaks; privileged has none."""
    if profile not in PROFILES:
        raise ValueError(f"no Pod Security profile {profile!r}: one of {', '.join(PROFILES)}")
    if profile == "restricted":
        return restricted_violations(pod)
    return baseline_violations(pod) if profile == "baseline" else []
