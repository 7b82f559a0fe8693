"""Settings every committed stack file must carry, beyond what infra/config.py validates."""

from __future__ import annotations

import pytest

from tests.infra.harness import COMMITTED_STACKS, stack_config


@pytest.mark.parametrize("stack", COMMITTED_STACKS)
def test_default_providers_are_disabled_instead_of_kubernetes_strict_mode(stack):
    # Without it, a Kubernetes resource that forgot the cluster provider silently targets whatever
    # ~/.kube/config points at (docs/field-notes.md §7). `pulumi:disable-default-providers` (pulumi/pulumi
    # #8829) refuses such a resource; strict mode would too, but fails a new stack's first preview
    # (tests/infra/test_aws_rules.py).
    config = stack_config(stack)
    assert {"aws", "kubernetes"} <= set(config.get("pulumi:disable-default-providers", []))
    assert "kubernetes:strictMode" not in config
