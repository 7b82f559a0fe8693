"""Every IAM and bucket policy document the program emits lints clean with parliament (a real IAM linter)."""

import json
import warnings

import pytest

from infra.data import tls_only_bucket_policy
from infra.network import flow_log_permissions_policy, flow_log_trust_policy

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # parliament imports pkg_resources
    import parliament


def findings(doc: dict) -> list[tuple[str, str]]:
    return [(f.issue, str(f.detail)) for f in parliament.analyze_policy_string(json.dumps(doc)).findings]


def trust_findings(doc: dict, role_arn: str) -> list[tuple[str, str]]:
    """Lint a role trust policy as the resource policy of the role it guards.

    parliament models identity and resource policies; a trust policy is the role's resource policy but
    carries no Resource element (IAM refuses one there), which parliament would report as MALFORMED.
    Naming the role as the Resource lets parliament check everything else: principal, action, condition
    keys and their types.
    """
    linted = {**doc, "Statement": [{**st, "Resource": role_arn} for st in doc["Statement"]]}
    return findings(linted)


def emitted_documents(result):
    """(resource name, kind, document) for every policy document among the captured resources."""
    out = []
    for res in result.resources:
        for key in ("policy", "assumeRolePolicy"):
            value = res.inputs.get(key)
            if isinstance(value, str):
                doc = json.loads(value)
                if "Statement" in doc:  # ECR lifecycle policies are not IAM documents
                    out.append((res, key, doc))
    return out


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_emitted_document_lints_clean(committed, stack):
    result = committed(stack)
    docs = emitted_documents(result)
    kinds = {res.type for res, _, _ in docs}
    assert "aws:s3/bucketPolicy:BucketPolicy" in kinds
    for res, key, doc in docs:
        if res.type == "aws:kms/key:Key":
            # A key policy is the key's resource policy; Resource "*" there means "this key" (KMS
            # developer guide, key policies). Its first statement is AWS's default one, the account
            # administering the key (kms:*: some kms actions have no key-level form, which parliament
            # reports); the others are linted against the key's ARN.
            admin, *rest = doc["Statement"]
            assert (admin["Effect"], admin["Action"], admin["Resource"]) == ("Allow", "kms:*", "*")
            assert admin["Principal"] == {"AWS": "arn:aws:iam::123456789012:root"}
            assert trust_findings({**doc, "Statement": rest}, res.outputs["arn"]) == [], res.name
        elif key == "assumeRolePolicy":
            assert trust_findings(doc, res.outputs["arn"]) == [], res.name
        else:
            assert findings(doc) == [], res.name


def test_base_documents_lint_clean():
    arn = "arn:aws:s3:::acme-ringtrain-dev-checkpoints"
    group = "arn:aws:logs:us-east-1:123456789012:log-group:/ringtrain/dev/vpc-flow-logs"
    assert findings(tls_only_bucket_policy(arn)) == []
    assert findings(flow_log_permissions_policy(group)) == []
    assert trust_findings(flow_log_trust_policy("123456789012"),
                          "arn:aws:iam::123456789012:role/net-flow-logs") == []


def test_the_linter_is_live():
    """The same checks report real mistakes: typo'd actions, a mistyped condition value."""
    doc = flow_log_permissions_policy("arn:aws:logs:us-east-1:123456789012:log-group:g")
    doc["Statement"][0]["Action"].append("logs:PutLogEvent")
    assert findings(doc)
    bad_tls = tls_only_bucket_policy("arn:aws:s3:::b")
    bad_tls["Statement"][0]["Condition"] = {"NumericLessThan": {"s3:TlsVersion": "1.2"}}
    assert findings(bad_tls)
    trust = flow_log_trust_policy("123456789012")
    trust["Statement"][0]["Action"] = "sts:AssumeRoles"
    assert trust_findings(trust, "arn:aws:iam::123456789012:role/r")
