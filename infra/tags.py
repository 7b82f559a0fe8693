"""Cost-allocation tags and the AWS provider that stamps them on every resource it manages."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

# Keys every AWS resource of a ringtrain stack carries (the policy pack's required-tags rule checks them).
REQUIRED_TAG_KEYS = ("project", "stack", "owner", "cost-center", "ttl")


def default_tags(project: str, stack: str, owner: str, cost_center: str, ttl_hours: int) -> dict[str, str]:
    """Tags applied to everything: who pays, who owns it, and how long it is meant to live."""
    return {
        "project": project,
        "stack": stack,
        "owner": owner,
        "cost-center": cost_center,
        # Informational: an operator (or the cost guard) compares it with the resource's age.
        "ttl": f"{ttl_hours}h",
    }


def tagged_provider(name: str, region: str, tags: dict[str, str], account_id: str) -> aws.Provider:
    """The explicit AWS provider every resource of the program uses (never the engine's default one).

    allowed_account_ids: the provider refuses credentials of any other account before any call
    ("AWS account ID not allowed: <id>"). Refresh configures providers from their inputs in the state,
    so this also guards `pulumi refresh` and `up --refresh` under a wrong profile, which would
    otherwise read every resource as deleted and drop it from the state."""
    return aws.Provider(
        name,
        region=region,
        allowed_account_ids=[account_id],
        default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
        opts=pulumi.ResourceOptions(),
    )
