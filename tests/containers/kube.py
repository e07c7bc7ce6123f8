"""deploy/kubernetes/ read as kustomize would build it (the subset it uses), for tests without kubectl.

Covered: resources, namespace, images, secretGenerator (files), patches (strategic merge of the Deployment,
ConfigMap shapes used here: maps merged, containers merged by name). Not covered: anything else kustomize does; a
kustomization using more is refused, so the tests cannot silently check something other than what ships.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

KUBE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KNOWN_FIELDS = {"apiVersion", "kind", "namespace", "resources", "secretGenerator", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


def load_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _merge(base: Any, patch: Any) -> Any:
    """Strategic merge for the shapes used here: dicts merged, lists of named items merged by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (isinstance(base, list) and isinstance(patch, list) and base and patch
            and all(isinstance(i, dict) and "name" in i for i in base + patch)):
        by_name = {item["name"]: item for item in base}
        merged = [_merge(by_name[item["name"]], item) if item["name"] in by_name else item for item in patch]
        patched = {item["name"] for item in patch}
        return [item for item in base if item["name"] not in patched] + merged
    return copy.deepcopy(patch)


def _image(image: str, rules: list[dict]) -> str:
    name, _, tag = image.partition(":")
    for rule in rules:
        if rule["name"] == name:
            return f"{rule.get('newName', name)}:{rule.get('newTag', tag or 'latest')}"
    return image


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


def build(directory: Path = KUBE, keys_dir: Path | None = None) -> list[dict]:
    """The documents `kustomize build directory` gives. keys_dir: the files secretGenerator reads (keys/)."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kust) - KNOWN_FIELDS
    assert not unknown, f"{directory}: kustomization fields this reader does not know: {unknown}"
    docs: list[dict] = []
    for resource in kust.get("resources", []):
        path = (directory / resource).resolve()
        docs.extend(build(path, keys_dir) if path.is_dir() else load_docs(path))
    for gen in kust.get("secretGenerator", []):
        data = {}
        for item in gen["files"]:
            key, _, file = item.partition("=")
            source = (keys_dir / Path(file).relative_to("keys")) if keys_dir else directory / file
            data[key] = base64.b64encode(source.read_bytes()).decode()
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]},
                     "type": gen.get("type", "Opaque"), "data": data})
    for patch in kust.get("patches", []):
        body = load_docs(directory / patch["path"])[0]
        target = patch.get("target", {"kind": body["kind"], "name": body["metadata"]["name"]})
        patch_body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "name"}}
        matched = 0
        for i, doc in enumerate(docs):
            if doc["kind"] == target["kind"] and doc["metadata"]["name"] == target["name"]:
                docs[i] = _merge(doc, patch_body)
                matched += 1
        assert matched, f"{directory}: patch {patch['path']} matches nothing ({target})"
    return _finish(docs, kust)


def _finish(docs: list[dict], kust: dict) -> list[dict]:
    for doc in docs:
        for container in _containers(doc):
            container["image"] = _image(container["image"], kust.get("images", []))
        if "namespace" in kust and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = kust["namespace"]
    return docs
