"""ringtrain's security baseline as CrossGuard policies (importable; the pack is built in __main__.py only).

Resource policies read a resource's inputs (camelCase, as the engine passes them); stack policies read
every resource's state and join resources by id (a bucket and its encryption / access-block / policy
resources, a launch template and its security groups and their rules). Each check is a plain function
over dicts so tests can call it on captured resources.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.tags import REQUIRED_TAG_KEYS

OPEN_CIDRS = {"0.0.0.0/0", "::/0"}
EFA_INTERFACE_TYPES = {"efa", "efa-only"}
PUBLIC_ACLS = {"public-read", "public-read-write", "authenticated-read"}

T_SG = "aws:ec2/securityGroup:SecurityGroup"
T_SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
T_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
T_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
T_LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
T_INSTANCE = "aws:ec2/instance:Instance"
T_EKS = "aws:eks/cluster:Cluster"
T_ECR = "aws:ecr/repository:Repository"
T_EBS = "aws:ebs/volume:Volume"
T_BUCKET = "aws:s3/bucket:Bucket"
T_SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
T_PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
T_BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
T_BUCKET_ACL = "aws:s3/bucketAcl:BucketAcl"
T_LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
IMDS_HOP_LIMIT = 1


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _json(value: Any) -> Any:
    """Policy documents and provider object inputs arrive as JSON text or as objects."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _truthy(value: Any) -> bool:
    # Some provider fields are strings ("true") in pulumi-aws (launch-template EBS `encrypted`).
    return value is True or (isinstance(value, str) and value.lower() == "true")


class Res:
    """Uniform view of a resource for the checks: type, urn, name, props."""

    __slots__ = ("type", "urn", "name", "props")

    def __init__(self, type_: str, urn: str, name: str, props: Mapping[str, Any]):
        self.type, self.urn, self.name, self.props = type_, urn, name, props

    @property
    def id(self) -> Any:
        return self.props.get("id")


def _resources(args: StackValidationArgs) -> list[Res]:
    return [Res(r.resource_type, r.urn, r.name, r.props) for r in args.resources]


Finding = tuple[str, str]  # (urn, message)


# --------------------------------------------------------------------------------------------
# Checks (pure)
# --------------------------------------------------------------------------------------------


def public_ingress_findings(type_: str, props: Mapping[str, Any]) -> list[str]:
    """Ingress from anywhere: security groups, their rules, and a public EKS API open to the world."""
    out: list[str] = []
    if type_ == T_SG:
        for rule in _as_list(props.get("ingress")):
            opened = OPEN_CIDRS & set(_as_list(rule.get("cidrBlocks")) + _as_list(rule.get("ipv6CidrBlocks")))
            if opened:
                out.append(f"inline ingress rule admits {sorted(opened)}")
    elif type_ == T_SG_RULE:
        opened = OPEN_CIDRS & set(_as_list(props.get("cidrBlocks")) + _as_list(props.get("ipv6CidrBlocks")))
        if props.get("type") == "ingress" and opened:
            out.append(f"ingress rule admits {sorted(opened)}")
    elif type_ == T_INGRESS:
        opened = OPEN_CIDRS & {props.get("cidrIpv4"), props.get("cidrIpv6")}
        if opened:
            out.append(f"ingress rule admits {sorted(opened)}")
    elif type_ == T_EKS:
        vpc = props.get("vpcConfig") or {}
        # AWS turns the public endpoint on, open to 0.0.0.0/0, when these are left unset.
        public = vpc.get("endpointPublicAccess", True) is not False
        cidrs = _as_list(vpc.get("publicAccessCidrs"))
        if public and (not cidrs or OPEN_CIDRS & set(cidrs)):
            out.append("public Kubernetes API endpoint reachable from 0.0.0.0/0 "
                       "(set vpcConfig.publicAccessCidrs or endpointPublicAccess: false)")
    return out


def imdsv2_findings(type_: str, props: Mapping[str, Any]) -> list[str]:
    if type_ not in (T_LAUNCH_TEMPLATE, T_INSTANCE):
        return []
    tokens = (props.get("metadataOptions") or {}).get("httpTokens")
    if tokens != "required":
        return [f"metadataOptions.httpTokens is {tokens!r}; IMDSv2 needs 'required'"]
    return []


def imds_hop_limit_findings(type_: str, props: Mapping[str, Any]) -> list[str]:
    """IMDS answers one hop only, so pods in their own network namespace cannot take the node role.

    Unset is a finding too: the EKS AL2023 AMIs register hop limit 2, which an instance inherits.
    """
    if type_ not in (T_LAUNCH_TEMPLATE, T_INSTANCE):
        return []
    hops = (props.get("metadataOptions") or {}).get("httpPutResponseHopLimit")
    if hops is None or float(hops) != IMDS_HOP_LIMIT:
        return [f"metadataOptions.httpPutResponseHopLimit is {hops!r}; must be {IMDS_HOP_LIMIT} so pods "
                "cannot read the node role's credentials from IMDS"]
    return []


def eks_upgrade_policy_findings(type_: str, props: Mapping[str, Any]) -> list[str]:
    """EKS clusters say STANDARD: EKS's default, EXTENDED, bills $0.60/h past standard support."""
    if type_ != T_EKS:
        return []
    support = (props.get("upgradePolicy") or {}).get("supportType")
    if support != "STANDARD":
        return [f"upgradePolicy.supportType is {support!r}; must be 'STANDARD' (EKS defaults to EXTENDED, "
                "billed at $0.60/h instead of $0.10/h once the version leaves standard support)"]
    return []


def log_retention_findings(type_: str, props: Mapping[str, Any]) -> list[str]:
    """Every CloudWatch log group expires its events (a group without retention keeps them forever)."""
    if type_ != T_LOG_GROUP:
        return []
    days = props.get("retentionInDays")
    if not days:
        return [f"log group {props.get('name')!r} has no retentionInDays: its events never expire"]
    return []


def encryption_findings(type_: str, props: Mapping[str, Any]) -> list[str]:
    """Encryption at rest for what is not an S3 bucket (buckets: s3_encryption_findings)."""
    if type_ == T_ECR:
        configs = _as_list(props.get("encryptionConfigurations"))
        if not configs or configs[0].get("encryptionType") != "KMS":
            return ["ECR repository is not encrypted with KMS (encryptionConfigurations.encryptionType: KMS)"]
    elif type_ == T_LAUNCH_TEMPLATE:
        bad = [m.get("deviceName", "?") for m in _as_list(props.get("blockDeviceMappings"))
               if m.get("ebs") is not None and not _truthy(m["ebs"].get("encrypted"))]
        if bad:
            return [f"EBS volumes not encrypted: {bad}"]
    elif type_ == T_EBS:
        if not _truthy(props.get("encrypted")):
            return ["EBS volume not encrypted"]
    elif type_ == T_EKS:
        resources = {r for c in _as_list(props.get("encryptionConfig")) for r in _as_list(c.get("resources"))}
        if "secrets" not in resources:
            return ["EKS secrets are not envelope-encrypted with KMS (encryptionConfig.resources: [secrets])"]
    return []


def tag_findings(type_: str, props: Mapping[str, Any], provider_props: Mapping[str, Any] | None) -> list[str]:
    """Every AWS resource ends up with the required tags: its own or its provider's default tags."""
    if not type_.startswith("aws:"):
        return []
    tags: dict[str, Any] = {}
    default = _json((provider_props or {}).get("defaultTags")) or {}
    if isinstance(default, Mapping):
        tags.update(default.get("tags") or {})
    tags.update(props.get("tags") or {})
    missing = [k for k in REQUIRED_TAG_KEYS if not tags.get(k)]
    if missing:
        return [f"missing required tags {missing} "
                "(neither on the resource nor in its provider's defaultTags)"]
    return []


def _children(resources: Iterable[Res], type_: str, bucket: Res) -> list[Res]:
    keys = {v for v in (bucket.id, bucket.props.get("bucket")) if v}
    return [r for r in resources if r.type == type_ and r.props.get("bucket") in keys]


def s3_encryption_findings(resources: list[Res]) -> list[Finding]:
    out: list[Finding] = []
    for bucket in (r for r in resources if r.type == T_BUCKET):
        ok = False
        for sse in _children(resources, T_SSE, bucket):
            for rule in _as_list(sse.props.get("rules")):
                default = rule.get("applyServerSideEncryptionByDefault") or {}
                kms = default.get("sseAlgorithm") in ("aws:kms", "aws:kms:dsse")
                if kms and default.get("kmsMasterKeyId"):
                    ok = True
        if not ok:
            out.append((bucket.urn, "bucket has no SSE-KMS default encryption with a customer key"))
    return out


def s3_public_findings(resources: list[Res]) -> list[Finding]:
    out: list[Finding] = []
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for bucket in (r for r in resources if r.type == T_BUCKET):
        blocks = _children(resources, T_PAB, bucket)
        if not any(all(b.props.get(f) is True for f in flags) for b in blocks):
            out.append((bucket.urn, f"bucket lacks a public access block with all of {list(flags)} true"))
        if bucket.props.get("acl") in PUBLIC_ACLS:
            out.append((bucket.urn, f"bucket ACL {bucket.props.get('acl')!r} is public"))
        for acl in _children(resources, T_BUCKET_ACL, bucket):
            if acl.props.get("acl") in PUBLIC_ACLS:
                out.append((acl.urn, f"bucket ACL {acl.props.get('acl')!r} is public"))
        for pol in _children(resources, T_BUCKET_POLICY, bucket):
            for st in _statements(pol.props.get("policy")):
                everyone = _is_everyone(st.get("Principal"))
                if st.get("Effect") == "Allow" and everyone and not st.get("Condition"):
                    out.append((pol.urn, "bucket policy allows everyone (Principal '*') without a condition"))
    return out


def s3_tls_findings(resources: list[Res]) -> list[Finding]:
    out: list[Finding] = []
    for bucket in (r for r in resources if r.type == T_BUCKET):
        arn = bucket.props.get("arn")
        needed = {arn, f"{arn}/*"}
        ok = any(_denies_insecure(st, needed)
                 for pol in _children(resources, T_BUCKET_POLICY, bucket)
                 for st in _statements(pol.props.get("policy")))
        if not ok:
            out.append((bucket.urn, "no bucket policy denies requests without TLS "
                                    "(aws:SecureTransport false) on the bucket and its objects"))
    return out


def _statements(policy: Any) -> list[dict]:
    doc = _json(policy)
    if not isinstance(doc, Mapping):
        return []
    return [s for s in _as_list(doc.get("Statement")) if isinstance(s, Mapping)]


def _is_everyone(principal: Any) -> bool:
    if principal == "*":
        return True
    return isinstance(principal, Mapping) and "*" in _as_list(principal.get("AWS"))


def _denies_insecure(st: Mapping[str, Any], resources: set) -> bool:
    cond = (st.get("Condition") or {}).get("Bool") or {}
    actions = set(_as_list(st.get("Action")))
    return (
        st.get("Effect") == "Deny"
        and _is_everyone(st.get("Principal"))
        and str(cond.get("aws:SecureTransport")).lower() == "false"
        and bool(actions & {"s3:*", "*"})
        and resources <= set(_as_list(st.get("Resource")))
    )


def _self_rules(resources: list[Res], sg: Res) -> tuple[bool, bool]:
    """Whether `sg` allows all traffic from itself (ingress) and to itself (egress)."""
    sg_id = sg.id
    ingress = egress = False

    def all_protocols(p: Any) -> bool:
        return str(p) in ("-1", "all")

    for direction in ("ingress", "egress"):
        for rule in _as_list(sg.props.get(direction)):
            if all_protocols(rule.get("protocol")) and (
                    rule.get("self") is True or sg_id in _as_list(rule.get("securityGroups"))):
                ingress = ingress or direction == "ingress"
                egress = egress or direction == "egress"
    for r in resources:
        p = r.props
        if p.get("securityGroupId") != sg_id or sg_id is None:
            continue
        if r.type in (T_INGRESS, T_EGRESS) and all_protocols(p.get("ipProtocol")) \
                and p.get("referencedSecurityGroupId") == sg_id:
            ingress = ingress or r.type == T_INGRESS
            egress = egress or r.type == T_EGRESS
        if r.type == T_SG_RULE and all_protocols(p.get("protocol")) \
                and (p.get("self") is True or p.get("sourceSecurityGroupId") == sg_id):
            ingress = ingress or p.get("type") == "ingress"
            egress = egress or p.get("type") == "egress"
    return ingress, egress


def efa_findings(resources: list[Res]) -> list[Finding]:
    """Every EFA interface sits in a group with all-traffic self ingress AND self egress."""
    out: list[Finding] = []
    groups = {r.id: r for r in resources if r.type == T_SG and r.id is not None}
    for lt in (r for r in resources if r.type == T_LAUNCH_TEMPLATE):
        bad: list[int] = []
        details: list[str] = []
        for i, nic in enumerate(_as_list(lt.props.get("networkInterfaces"))):
            if nic.get("interfaceType") not in EFA_INTERFACE_TYPES:
                continue
            sg_ids = _as_list(nic.get("securityGroups"))
            verdicts = {sid: _self_rules(resources, groups[sid]) if sid in groups else (False, False)
                        for sid in sg_ids}
            if not any(i_ok and e_ok for i_ok, e_ok in verdicts.values()):
                bad.append(i)
                detail = ", ".join(f"{sid}: self ingress {'yes' if v[0] else 'NO'}, self egress "
                                   f"{'yes' if v[1] else 'NO'}" for sid, v in verdicts.items()) or "no groups"
                if detail not in details:
                    details.append(detail)
        if bad:
            # One finding per launch template (a p5 template has 32 EFA interfaces).
            out.append((lt.urn, f"EFA interfaces {bad} have no security group allowing all traffic to AND "
                                f"from itself ({'; '.join(details)}); NCCL fails with 'Unresponsive "
                                "receiver' without it"))
    return out


# --------------------------------------------------------------------------------------------
# Policy objects
# --------------------------------------------------------------------------------------------


def _resource_policy(name: str, description: str, check) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        for message in check(args):
            report(message)

    return ResourceValidationPolicy(name=name, description=description, validate=validate,
                                    enforcement_level=EnforcementLevel.MANDATORY)


def _stack_policy(name: str, description: str, check) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        for urn, message in check(_resources(args)):
            report(message, urn)

    return StackValidationPolicy(name=name, description=description, validate=validate,
                                 enforcement_level=EnforcementLevel.MANDATORY)


def _provider_props(args: ResourceValidationArgs) -> Mapping[str, Any] | None:
    return args.provider.props if args.provider is not None else None


no_public_ingress = _resource_policy(
    "no-public-ingress", "No security group rule or public EKS endpoint admits 0.0.0.0/0 or ::/0.",
    lambda a: public_ingress_findings(a.resource_type, a.props))
imdsv2_required = _resource_policy(
    "imdsv2-required",
    "Launch templates and instances require IMDSv2 (metadataOptions.httpTokens: required).",
    lambda a: imdsv2_findings(a.resource_type, a.props))
imds_hop_limit_1 = _resource_policy(
    "imds-hop-limit-1",
    "Launch templates and instances set the IMDS hop limit to 1 (pods cannot reach the node role).",
    lambda a: imds_hop_limit_findings(a.resource_type, a.props))
eks_standard_support = _resource_policy(
    "eks-upgrade-policy-standard",
    "EKS clusters set upgradePolicy.supportType STANDARD (no extended-support billing).",
    lambda a: eks_upgrade_policy_findings(a.resource_type, a.props))
log_groups_expire = _resource_policy(
    "log-group-retention",
    "Every CloudWatch log group sets retentionInDays.",
    lambda a: log_retention_findings(a.resource_type, a.props))
encryption_at_rest = _resource_policy(
    "encryption-at-rest",
    "ECR, EBS volumes (launch templates, volumes) and EKS secrets are encrypted at rest with KMS.",
    lambda a: encryption_findings(a.resource_type, a.props))
required_tags = _resource_policy(
    "required-tags",
    f"Every AWS resource carries the tags {list(REQUIRED_TAG_KEYS)} (own or provider default).",
    lambda a: tag_findings(a.resource_type, a.props, _provider_props(a)))
s3_encryption = _stack_policy(
    "s3-sse-kms", "Every S3 bucket has default SSE-KMS encryption with a customer key.",
    s3_encryption_findings)
s3_no_public = _stack_policy(
    "s3-no-public-access", "Every S3 bucket blocks public access; no public ACL or open bucket policy.",
    s3_public_findings)
s3_tls_only = _stack_policy(
    "s3-tls-only", "Every S3 bucket's policy denies requests made without TLS.", s3_tls_findings)
efa_self_rules = _stack_policy(
    "efa-security-group-self-rules",
    "EFA interfaces use a security group allowing all traffic from AND to itself.", efa_findings)

RESOURCE_POLICIES: tuple[ResourceValidationPolicy, ...] = (
    no_public_ingress, imdsv2_required, imds_hop_limit_1, eks_standard_support, log_groups_expire,
    encryption_at_rest, required_tags)
STACK_POLICIES: tuple[StackValidationPolicy, ...] = (s3_encryption, s3_no_public, s3_tls_only, efa_self_rules)
ALL_POLICIES = RESOURCE_POLICIES + STACK_POLICIES
