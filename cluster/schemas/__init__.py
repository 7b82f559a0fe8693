"""Validate a rendered MPIJob: the MPI Operator's CRD schema and strict Kubernetes pod templates.

The CRD is the pinned operator's (README.md here: source, version, license). `kubernetes-validate`
(a development dependency) supplies the core Kubernetes schemas.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CRD_PATH = Path(__file__).with_name("kubeflow.org_mpijobs.yaml")
CRD_VERSION = "v2beta1"


@functools.cache
def mpijob_schema() -> dict:
    """The v2beta1 openAPIV3Schema of the MPIJob CRD."""
    import yaml

    doc = yaml.load(CRD_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in doc["spec"]["versions"] if v["name"] == CRD_VERSION]
    return version["schema"]["openAPIV3Schema"]


def validate_mpijob(manifest: Mapping[str, Any], kubernetes_version: str) -> None:
    """Raise jsonschema.ValidationError or kubernetes_validate.ValidationError if the manifest is not one
    the API server would accept: the CRD's schema for the whole object, and each replica's pod template
    as a strict Kubernetes PodTemplate (unknown fields are errors)."""
    import jsonschema
    import kubernetes_validate

    jsonschema.Draft7Validator(mpijob_schema()).validate(manifest)
    for role, replica in manifest["spec"]["mpiReplicaSpecs"].items():
        obj = {"apiVersion": "v1", "kind": "PodTemplate",
               "metadata": {"name": f"{manifest['metadata']['name']}-{role.lower()}",
                            "namespace": manifest["metadata"].get("namespace", "default")},
               "template": replica["template"]}
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
