"""Settings every committed stack file must carry, beyond what infra/config.py validates."""

from __future__ import annotations

import pytest

from tests.infra.harness import COMMITTED_STACKS, stack_config


@pytest.mark.parametrize("stack", COMMITTED_STACKS)
def test_kubernetes_strict_mode_is_on(stack):
    # Without it, a Kubernetes resource that forgot the cluster provider silently targets whatever
    # ~/.kube/config points at (docs/field-notes.md §7).
    assert stack_config(stack).get("kubernetes:strictMode") == "true"
