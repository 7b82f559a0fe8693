"""ringtrain's Pulumi program: one stack = data layer (always) + network + compute (while `compute: true`).

Order matters: the stack config is validated before any resource is declared, and a bad value ends the
run with one message (pulumi.RunError prints no traceback).

Compute goes, data stays: the data layer (KMS key, buckets, ECR) is declared unconditionally under the
same names and protected while `dataProtection` is true. `pulumi up` with `ringtrain:compute false`
deletes the cluster, node groups and NAT gateways and leaves the data layer as it is; the next `up` with
`compute: true` reuses it (same URNs). Deleting data takes `dataProtection: false` and then destroy.
"""

from __future__ import annotations

import sys
from datetime import date
from pathlib import Path

# Pulumi runs this directory as the program (cwd infra/); make `import infra.*` work without relying
# on the editable install.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pulumi  # noqa: E402
import pulumi_aws as aws  # noqa: E402

from infra.alerts import StackAlerts  # noqa: E402
from infra.budget import StackBudget  # noqa: E402
from infra.cluster import cluster_name, endpoint_reachable, lookup_cluster  # noqa: E402
from infra.compute import declare_compute, deploying_principal  # noqa: E402
from infra.config import (  # noqa: E402
    SUPPORTED_KUBERNETES,
    ConfigError,
    capacity_block_groups,
    check_capacity_blocks,
    check_deployer_is_admin,
    check_private_endpoint,
    load_stack_config,
    with_kubernetes_version,
)
from infra.data import DataLayer  # noqa: E402
from infra.logs import ServiceLogGroups  # noqa: E402
from infra.network import Network  # noqa: E402
from infra.nodegroups import lookup_capacity_block  # noqa: E402
from infra.security import SecurityGroups  # noqa: E402
from infra.tags import default_tags, tagged_provider  # noqa: E402
from infra.versions import VersionError, effective_version, support_notice  # noqa: E402


def main() -> None:
    try:
        settings = load_stack_config()
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None
    cfg = settings.stack
    project, stack = pulumi.get_project(), pulumi.get_stack()

    provider = tagged_provider(
        "aws-tagged", settings.region,
        default_tags(project, stack, cfg.owner, cfg.cost_center, cfg.ttl_hours), cfg.account_id)
    use_provider = pulumi.ResourceOptions(providers=[provider])
    if cfg.compute and capacity_block_groups(cfg):
        # Capacity Blocks are checked against AWS's record before anything is declared (the provider
        # above creates nothing): a block in another zone or of another type fails here, not 20
        # minutes into a node group that never gets an instance.
        try:
            check_capacity_blocks(settings, lambda rid: lookup_capacity_block(rid, provider))
        except ConfigError as exc:
            raise pulumi.RunError(str(exc)) from None
    if cfg.compute:
        name = cluster_name(stack)
        running = lookup_cluster(name, provider)
        try:
            if not cfg.cluster.public_access_cidrs:
                # A private API endpoint must answer from here, or the platform fails ~20 minutes in,
                # after the cluster exists: refuse before anything is declared.
                check_private_endpoint(settings, name, running.endpoint if running else None,
                                       endpoint_reachable)
            # EKS upgrades a STANDARD-support cluster itself at the end of standard support: keep its
            # version rather than ask for a downgrade (infra/versions.py).
            version, upgraded = effective_version(cfg.cluster.kubernetes_version,
                                                  running.version if running else None, SUPPORTED_KUBERNETES)
        except (ConfigError, VersionError) as exc:
            raise pulumi.RunError(str(exc)) from None
        if upgraded:
            pulumi.log.warn(upgraded)
            settings = with_kubernetes_version(settings, version)
            cfg = settings.stack
        try:
            check_deployer_is_admin(settings, deploying_principal(provider))
        except ConfigError as exc:
            raise pulumi.RunError(str(exc)) from None
        notice = support_notice(version, cfg.cluster.support_type, date.today())
        if notice:
            pulumi.log.warn(notice)
    account_id = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(provider=provider)).account_id

    data = DataLayer("data", cfg.data, stack=stack, protect=cfg.data_protection, opts=use_provider)
    # The data layer bills with compute off too: the budget is part of every stack.
    StackBudget("budget", cfg.cost_guard, project=project, stack=stack, opts=use_provider)
    # One confirmed e-mail subscription for the stack's alerts, kept across down/up (infra/alerts.py).
    alerts = StackAlerts("alerts", email=cfg.cost_guard.notification_email, project=project, stack=stack,
                         protect=cfg.data_protection, opts=use_provider)
    # Log groups AWS services write to under fixed names outlive compute (infra/logs.py).
    service_logs = ServiceLogGroups(
        "logs", project=project, stack=stack,
        container_log_retention_days=cfg.cluster.container_log_retention_days,
        protect=cfg.data_protection, opts=use_provider)
    network = Network("net", cfg.network, compute=cfg.compute, account_id=account_id, opts=use_provider)
    security = SecurityGroups("sg", vpc_id=network.vpc.id, vpc_cidr=cfg.network.cidr,
                              name_prefix=f"{project}-{stack}", opts=use_provider)

    pulumi.export("vpcId", network.vpc.id)
    pulumi.export("privateSubnetIds", network.private_subnet_ids)
    pulumi.export("gpuSubnetIds", network.gpu_subnet_ids)
    pulumi.export("efaSecurityGroupId", security.efa_sg.id)
    pulumi.export("datasetsBucket", data.datasets_bucket.bucket)
    pulumi.export("checkpointsBucket", data.checkpoints_bucket.bucket)
    pulumi.export("ecrRepositoryUrl", data.ecr_repo.repository_url)
    pulumi.export("kmsKeyArn", data.kms_key.arn)
    pulumi.export("alertTopicArn", alerts.topic.arn)

    if not cfg.compute:
        return
    # --- compute (infra-compute): cluster, node groups, platform, cost guard; one call + exports ---
    compute = declare_compute(
        settings, stack=stack, account_id=account_id, network=network, security=security, data=data,
        service_logs=service_logs, alert_topic=alerts.topic,
        tags=default_tags(project, stack, cfg.owner, cfg.cost_center, cfg.ttl_hours), opts=use_provider)
    for key, value in compute.exports().items():
        pulumi.export(key, value)


main()
