"""Run CrossGuard policies over resources captured by the harness, the way the policy analyzer would.

Resource policies get `ResourceValidationArgs` (the resource's inputs, options, and its provider's
inputs); stack policies get `StackValidationArgs` with every resource's state (inputs plus the outputs
the mocks computed, ids included). Returns the violations as (policy name, urn, message).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from tests.infra.harness import CapturedResource, ProgramResult


@dataclass(frozen=True)
class Violation:
    policy: str
    urn: str
    message: str


def _opts(res: CapturedResource) -> PolicyResourceOptions:
    return PolicyResourceOptions(
        protect=bool(res.protect), ignore_changes=list(res.ignore_changes), delete_before_replace=None,
        aliases=[], custom_timeouts=PolicyCustomTimeouts(0, 0, 0), additional_secret_outputs=[],
        parent=res.parent or None)


def _provider(result: ProgramResult, res: CapturedResource) -> PolicyProviderResource | None:
    if not res.provider:
        return None
    prov = result.by_urn(res.provider_urn)
    return PolicyProviderResource(prov.type, prov.inputs, prov.urn, prov.name)


def _validated(result: ProgramResult) -> list[CapturedResource]:
    # The analyzer sees custom resources and providers; components have no provider-side state.
    return [r for r in result.resources if r.custom]


def run_resource_policy(policy: ResourceValidationPolicy, result: ProgramResult) -> list[Violation]:
    out: list[Violation] = []
    for res in _validated(result):
        def report(message: str, urn: str | None = None, _res: CapturedResource = res) -> None:
            out.append(Violation(policy.name, _res.urn, message))

        args = ResourceValidationArgs(res.type, res.inputs, res.urn, res.name, _opts(res),
                                      _provider(result, res))
        policy.validate(args, report)
    return out


def run_stack_policy(policy: StackValidationPolicy, result: ProgramResult) -> list[Violation]:
    out: list[Violation] = []
    by_urn: dict[str, PolicyResource] = {}
    resources: list[PolicyResource] = []
    for res in _validated(result):
        pr = PolicyResource(res.type, res.outputs, res.urn, res.name, _opts(res), _provider(result, res),
                            parent=None, dependencies=[], property_dependencies={})
        by_urn[res.urn] = pr
        resources.append(pr)
    for res in _validated(result):
        pr = by_urn[res.urn]
        pr.parent = by_urn.get(res.parent)
        pr.dependencies = [by_urn[u] for u in res.dependencies if u in by_urn]

    def report(message: str, urn: str | None = None) -> None:
        out.append(Violation(policy.name, urn or "", message))

    policy.validate(StackValidationArgs(resources), report)
    return out


def run_policies(policies: Iterable, result: ProgramResult) -> list[Violation]:
    out: list[Violation] = []
    for policy in policies:
        if isinstance(policy, StackValidationPolicy):
            out += run_stack_policy(policy, result)
        else:
            out += run_resource_policy(policy, result)
    return out
