"""Stack lifecycle logic (up / down / delete-data / status / kubeconfig) and the real Automation API path."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from cluster.aws import stack as stack_mod
from cluster.aws.stack import (
    AutomationStack,
    StackError,
    delete_data,
    require_aws_credentials,
    require_pulumi_cli,
    stack_down,
    stack_status,
    stack_up,
    write_kubeconfig,
)


class RecordingStack:
    """A StackOps that records what the lifecycle logic asks of the stack, in order."""

    def __init__(self, name="dev", outputs=None, config=None):
        self.name = name
        self.calls: list[tuple] = []
        self.config = dict(config or {})
        self._outputs = dict(outputs or {})

    def set_config(self, key, value):
        self.calls.append(("set_config", key, value))
        self.config[key] = value

    def get_config(self, key):
        return self.config.get(key)

    def up(self):
        # what the program would see at this moment
        self.calls.append(("up", dict(self.config)))

    def destroy(self):
        self.calls.append(("destroy", dict(self.config)))

    def outputs(self):
        return dict(self._outputs)

    def last_update(self):
        return {"kind": "update", "result": "succeeded"}


def test_up_turns_compute_on_then_deploys():
    ops = RecordingStack(outputs={"clusterName": "c"}, config={"ringtrain:compute": "false"})
    assert stack_up(ops) == {"clusterName": "c"}
    assert ops.calls == [("set_config", "ringtrain:compute", "true"), ("up", {"ringtrain:compute": "true"})]


def test_down_removes_compute_only_and_never_destroys():
    ops = RecordingStack(config={"ringtrain:compute": "true", "ringtrain:dataProtection": "true"})
    stack_down(ops)
    assert ops.calls == [
        ("set_config", "ringtrain:compute", "false"),
        ("up", {"ringtrain:compute": "false", "ringtrain:dataProtection": "true"}),
    ]


def test_delete_data_needs_the_typed_stack_name():
    ops = RecordingStack(name="prod")
    refused = "confirmation 'dev' does not match stack name 'prod': nothing was deleted"
    with pytest.raises(StackError, match=refused):
        delete_data(ops, confirm=None, ask=lambda prompt: "dev")
    with pytest.raises(StackError, match="typed confirmation: run interactively or pass --confirm prod$"):
        delete_data(ops, confirm=None, ask=None)
    with pytest.raises(StackError, match="does not match"):
        delete_data(ops, confirm="prod2", ask=None)
    assert ops.calls == []  # nothing touched on a refused confirmation


def test_delete_data_unprotects_in_state_before_destroying():
    ops = RecordingStack(name="prod", config={"ringtrain:dataProtection": "true"})
    prompts = []
    purge = lambda outputs: ops.calls.append(("purge", outputs))  # noqa: E731
    ops._outputs = {"datasetsBucket": "d"}
    delete_data(ops, confirm=None, ask=lambda prompt: prompts.append(prompt) or "prod\n", purge=purge)
    assert "INCLUDING its datasets" in prompts[0] and "(prod)" in prompts[0]
    unprotected = {"ringtrain:dataProtection": "false", "ringtrain:compute": "false"}
    assert ops.calls[-3:] == [("up", unprotected), ("purge", {"datasetsBucket": "d"}),
                              ("destroy", unprotected)]
    # non-interactive form
    ops2 = RecordingStack(name="prod")
    delete_data(ops2, confirm="prod", ask=None, purge=lambda outputs: None)
    assert [c[0] for c in ops2.calls][-2:] == ["up", "destroy"]


def test_status_hides_the_kubeconfig_secret():
    ops = RecordingStack(outputs={"kubeconfig": "apiVersion: v1", "clusterName": "c"},
                         config={"ringtrain:compute": "true"})
    status = stack_status(ops)
    assert status["outputs"] == {"clusterName": "c", "kubeconfig": "[secret]"}
    assert status["compute"] == "true" and status["stack"] == "dev"


def test_kubeconfig_written_0600_from_string_or_object(tmp_path):
    path = tmp_path / "kube" / "cfg.yaml"
    write_kubeconfig({"kubeconfig": "apiVersion: v1\nkind: Config\n"}, path, stack="dev")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text() == "apiVersion: v1\nkind: Config\n"
    # an existing world-readable file is tightened, and an object output is written as YAML
    path.chmod(0o644)
    write_kubeconfig({"kubeconfig": {"apiVersion": "v1", "kind": "Config"}}, path, stack="dev")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert yaml.safe_load(path.read_text()) == {"apiVersion": "v1", "kind": "Config"}
    with pytest.raises(StackError, match="stack 'dev' has no kubeconfig output: its compute is down"):
        write_kubeconfig({}, tmp_path / "x", stack="dev")


def test_missing_cli_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(StackError, match=r"the Pulumi CLI \(`pulumi`\) is not on PATH: install it"):
        require_pulumi_cli()
    with pytest.raises(StackError, match="not on PATH"):
        AutomationStack("dev")


def test_missing_aws_credentials_is_a_clear_error(monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StackError, match="no AWS credentials found"):
        require_aws_credentials()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    require_aws_credentials()


class _ApiStack:
    """Stands in for pulumi.automation.Stack: binds each up() call to the installed Stack.up signature
    and keeps the CLI arguments the Automation API would add for it."""

    def __init__(self):
        self.cli_args: list[list[str]] = []

    def outputs(self):
        return {}

    def up(self, **kwargs):
        import inspect

        from pulumi import automation as auto
        from pulumi.automation._stack import _parse_extra_args  # what Stack.up turns kwargs into

        inspect.signature(auto.Stack.up).bind(self, **kwargs)  # TypeError on a kwarg it lacks
        self.cli_args.append(_parse_extra_args(**kwargs))


def _api_backed_stack(tmp_path, account="123456789012"):
    """A real AutomationStack over the _ApiStack stand-in, its stack file a copy of Pulumi.dev.yaml in
    tmp_path whose accountId is moto's account."""
    from pulumi import automation as auto

    doc = yaml.safe_load((stack_mod.REPO_ROOT / "Pulumi.dev.yaml").read_text())
    doc["config"]["ringtrain:accountId"] = account
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    ops = AutomationStack.__new__(AutomationStack)  # no CLI here: only up() and destroy() are exercised
    ops._auto, ops.name, ops._on_output, ops._stack = auto, "dev", print, _ApiStack()
    ops._work_dir, ops._run_config, ops.force = tmp_path, {}, False
    ops._cost_explorer = lambda: CostExplorerStub({"project": "Active", "stack": "Active"})
    ops._service_quotas = lambda: ServiceQuotasStub({})  # every quota at its large default
    return ops


@pytest.fixture
def moto_sts(monkeypatch):
    """STS answered in-process by moto (account 123456789012); no real AWS reachable."""
    moto = pytest.importorskip("moto")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    with moto.mock_aws():
        yield


def test_every_up_refreshes_the_state_first(tmp_path, moto_sts):
    """`pulumi up --refresh`: ignore_changes on a GPU group's desired size keeps the size last written
    to the state; without a refresh, a min/max change would send that stale size to a resized group."""
    ops = _api_backed_stack(tmp_path)
    stack_up(ops)
    stack_down(ops)
    assert [args[0] for args in ops._stack.cli_args] == ["--refresh", "--refresh"]


def test_up_and_down_pass_compute_for_the_run_and_never_rewrite_the_stack_file(tmp_path, moto_sts):
    """Before, set_config wrote `ringtrain:compute` into the committed Pulumi.<stack>.yaml on every up and
    down. Now the run's values reach Pulumi through a temporary copy (`--config-file`)."""
    ops = _api_backed_stack(tmp_path)
    committed = (tmp_path / "Pulumi.dev.yaml").read_text()
    seen = []
    real_up = ops._stack.up

    def up(**kwargs):
        seen.append(yaml.safe_load(Path(kwargs["config_file"]).read_text()))
        real_up(**kwargs)

    ops._stack.up = up
    stack_up(ops)
    stack_down(ops)
    assert (tmp_path / "Pulumi.dev.yaml").read_text() == committed
    assert [doc["config"]["ringtrain:compute"] for doc in seen] == ["true", "false"]
    for doc in seen:  # the rest of the stack's settings travels unchanged
        assert {k: v for k, v in doc["config"].items() if k != "ringtrain:compute"} == \
            yaml.safe_load(committed)["config"]
    assert all(args[1] == "--config-file" for args in ops._stack.cli_args)
    assert not any(os.path.exists(args[2]) for args in ops._stack.cli_args)  # the copies are gone


def test_up_refuses_credentials_of_another_account_before_pulumi_starts(tmp_path, moto_sts):
    ops = _api_backed_stack(tmp_path, account="111122223333")
    refused = (r"stack 'dev' lives in AWS account 111122223333 \(ringtrain:accountId in Pulumi.dev.yaml\), "
               r"but these credentials are of account 123456789012")
    with pytest.raises(StackError, match=refused):
        stack_up(ops)
    with pytest.raises(StackError, match="lives in AWS account 111122223333"):
        ops.destroy()
    assert ops._stack.cli_args == []  # Pulumi never ran


def test_a_stack_file_without_account_id_is_refused():
    with pytest.raises(StackError, match="Pulumi.x.yaml has no ringtrain:accountId: set it to the 12-digit"):
        stack_mod.check_caller_account("x", None, "123456789012")
    stack_mod.check_caller_account("x", "123456789012", "123456789012")


def test_real_stack_selection_with_the_cli(tmp_path):
    """With the Pulumi CLI present: a local file backend, the repository's project, stack outputs."""
    if shutil.which("pulumi") is None:
        pytest.skip("needs the Pulumi CLI (`pulumi` on PATH): the Automation API drives it")
    env = {"PULUMI_BACKEND_URL": f"file://{tmp_path}", "PULUMI_CONFIG_PASSPHRASE": "test"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ops = AutomationStack("ci-select-test", work_dir=stack_mod.REPO_ROOT)
        assert ops.outputs() == {}
        assert ops.last_update() is None
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stack_file = stack_mod.REPO_ROOT / "Pulumi.ci-select-test.yaml"
        if stack_file.exists():
            stack_file.unlink()


def test_purge_empties_versioned_buckets_and_the_image_repository(object_store, monkeypatch, tmp_path):
    """Against the moto server on loopback: every version and delete marker, every image."""
    import boto3

    env = {**object_store.env(), "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "c"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "c")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="purge-datasets")
    s3.put_bucket_versioning(Bucket="purge-datasets", VersioningConfiguration={"Status": "Enabled"})
    for body in (b"one", b"two"):
        s3.put_object(Bucket="purge-datasets", Key="datasets/x/shard-0", Body=body)
    s3.delete_object(Bucket="purge-datasets", Key="datasets/x/shard-0")  # leaves a delete marker
    s3.create_bucket(Bucket="purge-checkpoints")
    s3.put_object(Bucket="purge-checkpoints", Key="checkpoints/j/step-1", Body=b"c")
    ecr = boto3.client("ecr")
    url = ecr.create_repository(repositoryName="ringtrain/purge/trainer")["repository"]["repositoryUri"]
    ecr.put_image(repositoryName="ringtrain/purge/trainer", imageTag="0.1.0",
                  imageManifestMediaType="application/vnd.docker.distribution.manifest.v2+json",
                  imageManifest=json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "0" * 64}}))

    stack_mod.purge_data_layer({"datasetsBucket": "purge-datasets", "checkpointsBucket": "purge-checkpoints",
                                "ecrRepositoryUrl": url})

    for bucket in ("purge-datasets", "purge-checkpoints"):
        left = s3.list_object_versions(Bucket=bucket)
        assert not left.get("Versions") and not left.get("DeleteMarkers"), bucket
        s3.delete_bucket(Bucket=bucket)  # S3 accepts it now: the bucket is empty
    assert ecr.list_images(repositoryName="ringtrain/purge/trainer")["imageIds"] == []


# -- no GPU node rolls under a running job ---------------------------------------------------------

ROLL = stack_mod.PlannedStep("update", "aws:eks/nodeGroup:NodeGroup",
                             "urn:pulumi:dev::ringtrain::ringtrain:compute:NodeGroups$aws:eks/nodeGroup:NodeGroup::"
                             "nodes-a10g-spot", ("launchTemplate",))
GROUPS = {"nodes-a10g-spot": "a10g-spot", "nodes-l4-spot": "l4-spot"}


def test_launch_template_version_and_replacements_roll_a_group_but_sizes_do_not():
    sized = stack_mod.PlannedStep("update", ROLL.type, ROLL.urn.replace("a10g", "l4"), ("scalingConfig",))
    system = stack_mod.PlannedStep("update", ROLL.type, ROLL.urn.replace("a10g-spot", "system"), ("version",))
    replaced = stack_mod.PlannedStep("replace", ROLL.type, ROLL.urn.replace("a10g", "l4"), ())
    assert stack_mod.rolling_node_groups([ROLL, sized, system], GROUPS) == ["a10g-spot"]
    assert stack_mod.rolling_node_groups([replaced], GROUPS) == ["l4-spot"]
    tagged = stack_mod.PlannedStep("update", ROLL.type, ROLL.urn, ("launchTemplate.version",))
    assert stack_mod.rolling_node_groups([tagged], GROUPS) == ["a10g-spot"]


def test_a_roll_of_a_group_with_nodes_is_refused_unless_forced():
    refused = (r"would replace every node of GPU node group\(s\) a10g-spot \(2 nodes, Capacity Block\)"
               r".*or run `up --force`")
    with pytest.raises(StackError, match=refused):
        stack_mod.check_no_roll_under_jobs("dev", ["a10g-spot"], {"a10g-spot": 2},
                                           {"a10g-spot": "CAPACITY_BLOCK"}, force=False)
    stack_mod.check_no_roll_under_jobs("dev", ["a10g-spot"], {"a10g-spot": 2}, {}, force=True)
    stack_mod.check_no_roll_under_jobs("dev", ["a10g-spot"], {"a10g-spot": 0}, {}, force=False)  # idle


def test_up_previews_first_and_stops_before_rolling_a_busy_group(tmp_path, moto_sts, monkeypatch):
    from types import SimpleNamespace

    ops = _api_backed_stack(tmp_path)
    outputs = {"clusterName": "ringtrain-dev", "nodeGroups": {
        "a10g-spot": {"eksNodeGroupName": "ringtrain-dev-a10g-spot", "capacityType": "SPOT"},
        "l4-spot": {"eksNodeGroupName": "ringtrain-dev-l4-spot", "capacityType": "SPOT"}}}
    ops.outputs = lambda: outputs
    event = SimpleNamespace(resource_pre_event=SimpleNamespace(metadata=SimpleNamespace(
        op=ROLL.op, type=ROLL.type, urn=ROLL.urn, diffs=list(ROLL.diffs))))
    previews = []

    def preview(on_event, **kwargs):
        previews.append(kwargs)
        on_event(event)

    ops._stack.preview = preview
    asked = []
    monkeypatch.setattr(stack_mod, "node_counts",
                        lambda cluster, names: asked.append(names) or {"a10g-spot": 3})
    with pytest.raises(StackError, match="a10g-spot \\(3 nodes\\)"):
        stack_up(ops)
    assert ops._stack.cli_args == []  # no up ran
    assert asked == [{"a10g-spot": "ringtrain-dev-a10g-spot"}] and previews[0]["refresh"] is True
    ops.force = True
    stack_up(ops)
    assert len(ops._stack.cli_args) == 1


def test_down_reports_each_capacity_block_after_the_update(monkeypatch):
    from datetime import UTC, datetime

    ops = RecordingStack(name="prod")
    monkeypatch.setattr(stack_mod, "capacity_block_groups",
                        lambda stack: [("h100-block", "cr-0123456789abcdef0")])
    said = []
    end = datetime(2099, 1, 1, tzinfo=UTC)
    stack_down(ops, notify=lambda line: said.append((len(ops.calls), line)),
               blocks=lambda ids: {i: {"EndDate": end, "InstanceType": "p5.48xlarge", "InstanceCount": 2,
                                       "State": "active"} for i in ids})
    (after, line), = said
    assert after == 2 and ops.calls[-1][0] == "up"  # printed once the compute is down
    assert "cr-0123456789abcdef0 (node group h100-block" in line and "cannot be cancelled" in line


# -- cost-allocation tags ---------------------------------------------------------------------------


class CostExplorerStub:
    """Cost Explorer's ListCostAllocationTags / UpdateCostAllocationTagsStatus over a dict of statuses."""

    def __init__(self, statuses, fail=None, errors=()):
        self.statuses, self.fail, self.errors, self.updates = dict(statuses), fail, list(errors), []

    def list_cost_allocation_tags(self, TagKeys, Type):
        if self.fail:
            raise self.fail
        return {"CostAllocationTags": [{"TagKey": k, "Type": Type, "Status": self.statuses[k]}
                                       for k in TagKeys if k in self.statuses]}

    def update_cost_allocation_tags_status(self, CostAllocationTagsStatus):
        self.updates.append(CostAllocationTagsStatus)
        failed = {e["TagKey"] for e in self.errors}
        for entry in CostAllocationTagsStatus:
            if entry["TagKey"] not in failed:
                self.statuses[entry["TagKey"]] = entry["Status"]
        return {"Errors": self.errors}


def test_active_tags_need_nothing_and_say_nothing():
    ce = CostExplorerStub({"project": "Active", "stack": "Active"})
    assert stack_mod.activate_cost_allocation_tags(ce) == [] and ce.updates == []


def test_inactive_tags_are_activated_and_counted_from_now_on():
    ce = CostExplorerStub({"project": "Inactive", "stack": "Active"})
    (note,) = stack_mod.activate_cost_allocation_tags(ce)
    assert ce.updates == [[{"TagKey": "project", "Status": "Active"}]] and ce.statuses["project"] == "Active"
    assert note.startswith("activated the cost-allocation tags project: the budget counts tagged spend")


def test_tags_billing_has_not_seen_yet_and_member_accounts_are_explained():
    (unseen,) = stack_mod.activate_cost_allocation_tags(CostExplorerStub({"project": "Active"}))
    assert "the tag keys stack are not in the billing data yet" in unseen
    assert "budget sees no spend until the cost-allocation tags project and stack are active" in unseen
    denied = CostExplorerStub({}, fail=RuntimeError("AccessDeniedException: not the management account"))
    (note,) = stack_mod.activate_cost_allocation_tags(denied)
    assert "AccessDeniedException" in note and "only the management account may" in note
    refused = CostExplorerStub({"project": "Inactive", "stack": "Inactive"},
                               errors=[{"TagKey": "stack", "Code": "X", "Message": "no"}])
    notes = stack_mod.activate_cost_allocation_tags(refused)
    assert notes[0] == "could not activate the cost-allocation tag stack: X no"
    assert "sees no spend" in notes[1]


def test_up_activates_the_tags_after_deploying_and_prints_why_not(tmp_path, moto_sts):
    ops = _api_backed_stack(tmp_path)
    printed = []
    ops._on_output = printed.append
    ce = CostExplorerStub({"project": "Inactive", "stack": "Inactive"})
    ops._cost_explorer = lambda: ce
    stack_up(ops)
    assert ce.updates and any("activated the cost-allocation tags project, stack" in p for p in printed)
    stack_down(ops)  # compute off: nothing to activate
    assert len(ce.updates) == 1


# -- EC2 vCPU quotas ----------------------------------------------------------------------------------


class ServiceQuotasStub:
    """Service Quotas' GetServiceQuota / GetAWSDefaultServiceQuota: applied values, else a default."""

    def __init__(self, applied, default=100000.0, fail=None):
        self.applied, self.default, self.fail, self.asked = dict(applied), default, fail, []

    def get_service_quota(self, ServiceCode, QuotaCode):
        self.asked.append((ServiceCode, QuotaCode))
        if self.fail:
            raise self.fail
        if QuotaCode not in self.applied:
            raise RuntimeError("NoSuchResourceException: the quota was never changed")
        return {"Quota": {"QuotaCode": QuotaCode, "Value": self.applied[QuotaCode]}}

    def get_aws_default_service_quota(self, ServiceCode, QuotaCode):
        return {"Quota": {"QuotaCode": QuotaCode, "Value": self.default}}


def test_up_stops_before_pulumi_when_a_vcpu_quota_is_too_low(tmp_path, moto_sts):
    ops = _api_backed_stack(tmp_path)
    quotas = ServiceQuotasStub({"L-3819A6DF": 384.0})  # dev's two spot groups need 2 x 4 x 96 = 768
    ops._service_quotas = lambda: quotas
    refused = (r"EC2 vCPU quota too low: All G and VT Spot Instance Requests \(L-3819A6DF\) is 384 vCPUs in "
               r"us-east-1, and node group\(s\) a10g-spot, l4-spot need 768 at maxSize")
    with pytest.raises(StackError, match=refused):
        stack_up(ops)
    assert ops._stack.cli_args == []
    assert ("ec2", "L-1216C47A") in quotas.asked  # the system nodes' standard quota, read via its default


def test_an_unreadable_quota_is_reported_not_fatal(tmp_path):
    doc = yaml.safe_load((stack_mod.REPO_ROOT / "Pulumi.prod.yaml").read_text())
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(doc))
    denied = ServiceQuotasStub({}, fail=RuntimeError("AccessDenied"))
    notes = stack_mod.require_quotas("prod", tmp_path, denied)
    assert len(notes) == 3 and all("not checked" in n and "AccessDenied" in n for n in notes)
