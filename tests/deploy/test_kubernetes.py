"""deploy/kubernetes: every manifest valid against the Kubernetes API schemas (kubernetes-validate,
offline: the schemas ship in the package), the kustomization complete, the DaemonSet's
privileges and mounts as the README says, the TOMLs it mounts loaded by the daemons' own code."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from firstfault.agent.config import load_config as load_agent_config
from firstfault.agent.daemon import build_sources
from firstfault.agent.hostpaths import HostPaths
from firstfault.collector.config import load_config as load_collector_config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSIONS = ("1.29.0", "1.37.0")  # the oldest release we support and the newest the validator knows


def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def resources() -> list[dict]:
    return [doc for name in kustomization()["resources"] for doc in yaml.safe_load_all((K8S / name).read_text())]


def by_kind(kind: str) -> dict:
    [doc] = [d for d in resources() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version):
    docs = resources()
    assert {d["kind"] for d in docs} == {"Namespace", "Service", "StatefulSet", "DaemonSet"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises on any unknown or wrong field


def test_the_validator_rejects_what_the_api_server_would():
    ds = by_kind("DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["adds"] = ["SYSLOG"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)


def test_the_kustomization_names_only_files_that_are_there_and_the_token_is_never_committed():
    k = kustomization()
    assert (k["apiVersion"], k["kind"], k["namespace"]) == ("kustomize.config.k8s.io/v1beta1", "Kustomization",
                                                          "firstfault")
    for name in k["resources"]:
        assert (K8S / name).is_file(), name
    for gen in k["configMapGenerator"]:
        assert all((K8S / f).is_file() for f in gen["files"])
    [secret] = k["secretGenerator"]
    assert secret["files"] == ["token"] and "token" in (K8S / ".gitignore").read_text().split()
    made = {g["name"] for g in k["configMapGenerator"]} | {secret["name"]}
    for kind in ("DaemonSet", "StatefulSet"):
        spec = by_kind(kind)["spec"]["template"]["spec"]
        used = {v.get("configMap", {}).get("name") or v.get("secret", {}).get("secretName")
                for v in spec["volumes"]} - {None}
        assert used <= made, used - made


def test_the_agent_runs_with_the_least_privileges_and_reads_the_host_read_only():
    ds = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and "hostNetwork" not in pod and pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    [c] = pod["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG", "SYS_PTRACE"]}
    assert sc["allowPrivilegeEscalation"] is False and "privileged" not in sc and sc["readOnlyRootFilesystem"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert set(host.values()) == {"/var/lib/firstfault-agent", "/var/log/pods", "/var/log/containers",
                                  "/sys/fs/cgroup", "/dev/kmsg"}
    for name, path in host.items():
        assert mounts[name].get("readOnly", False) is (path != "/var/lib/firstfault-agent"), name
    assert "--node" in c["args"] and c["args"][c["args"].index("--node") + 1] == "$(NODE_NAME)"


def test_the_collector_keeps_its_database_on_a_volume_behind_a_service():
    sts, svc = by_kind("StatefulSet"), by_kind("Service")
    [claim] = sts["spec"]["volumeClaimTemplates"]
    [c] = sts["spec"]["template"]["spec"]["containers"]
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}[claim["metadata"]["name"]] == "/var/lib/firstfault"
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert {p["port"] for p in svc["spec"]["ports"]} == {p["containerPort"] for p in c["ports"]} == {7140, 7141}
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_tomls_in_the_config_maps_load_and_build_the_agents_sources(tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken-for-the-test\n")
    col = load_collector_config(K8S / "collector.toml", {(None, "token_file"): str(token)})
    assert col.db == "/var/lib/firstfault/firstfault.db" and col.listen.port == 7140
    agent = load_agent_config(K8S / "agent.toml", {(None, "token_file"): str(token),
                                                   (None, "state_dir"): str(tmp_path / "state")})
    assert agent.collectors[0].host == "firstfault-collector.firstfault.svc"
    (tmp_path / "kmsg").write_bytes(b"")  # the manifest mounts /dev/kmsg; a container running this test may lack it
    built = {s.name: s for s in build_sources(agent, HostPaths(dev=str(tmp_path)), create_dirs=True)[0]}
    assert built["ranklog"].patterns() == ["/var/log/pods/*_*_*/*/*.log"]
    assert built["pods"].cgroup_root == "/host/sys/fs/cgroup"


def test_the_readmes_token_command_makes_a_token_the_daemons_take(tmp_path):
    import shutil
    import subprocess

    from tests.readme import ROOT, command
    cmd = command(ROOT / "README.md", "head -c 32 /dev/urandom | base64 > deploy/kubernetes/token")
    shutil.copytree(K8S, tmp_path / "deploy" / "kubernetes")
    subprocess.run(["bash", "-c", cmd], cwd=tmp_path, check=True, timeout=30)
    token = tmp_path / "deploy" / "kubernetes" / "token"
    col = load_collector_config(K8S / "collector.toml", {(None, "token_file"): str(token)})
    assert len(col.token) == 44  # 32 random bytes in base64
    # the real path is never committed: .gitignore names it (read, not asked of git: a copy of the
    # tree, as the container and fresh-venv tests make, is no repository)
    ignores = {ln.strip() for ln in (K8S / ".gitignore").read_text().splitlines()}
    assert "token" in ignores or "/token" in ignores
