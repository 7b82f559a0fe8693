"""Stack lifecycle through the Pulumi Automation API: up, down (compute only), delete-data, status, outputs.

One stack per environment holds both layers (infra contract): `ringtrain:compute` switches the cluster
and everything that costs money by the hour; the data layer (KMS key, buckets, ECR) stays, protected
by `ringtrain:dataProtection`. So:

    up            compute=true,  pulumi up --refresh
    down          compute=false, pulumi up --refresh (data untouched, same URNs: a later up reuses them)
    delete-data   typed confirmation, then dataProtection=false + compute=false, pulumi up (lifts the
                  protect flags in the state), empty the buckets (every version) and the image
                  repository (the program never force-destroys them), then pulumi destroy

`compute` and `dataProtection` are run-time settings of one command: they go to Pulumi through a
temporary copy of Pulumi.<stack>.yaml (`--config-file`), so the committed file is never rewritten
(before, every `down` left `ringtrain:compute: false` in it, a diff in the repository). Before Pulumi
starts, the caller's account must be the stack's `ringtrain:accountId`.

The lifecycle logic talks to a small seam (`StackOps`); `AutomationStack` is the real implementation
over `pulumi.automation.LocalWorkspace` in the repository's project (Pulumi.yaml at the root).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import yaml

from cluster.backend import BackendError

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPUTE_KEY = "ringtrain:compute"
DATA_PROTECTION_KEY = "ringtrain:dataProtection"
ACCOUNT_ID_KEY = "ringtrain:accountId"
CLI_INSTALL_HINT = ("install it from https://www.pulumi.com/docs/iac/download-install/ "
                    "and log in (`pulumi login`)")


class StackError(BackendError):
    """A stack operation cannot run or failed; the message says what and what to do."""


def require_pulumi_cli() -> str:
    path = shutil.which("pulumi")
    if path is None:
        raise StackError(f"the Pulumi CLI (`pulumi`) is not on PATH: {CLI_INSTALL_HINT}. "
                         "Without it only `plan` works (offline).")
    return path


def stack_account_id(stack: str, work_dir: Path = REPO_ROOT) -> str | None:
    """`ringtrain:accountId` of the committed Pulumi.<stack>.yaml (None when absent)."""
    path = Path(work_dir) / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text()) if path.exists() else None
    value = ((doc or {}).get("config") or {}).get(ACCOUNT_ID_KEY)
    return None if value is None else str(value)


def check_caller_account(stack: str, expected: str | None, caller_account: str) -> None:
    """Refuse credentials of another account than the stack's (pure; the provider's allowedAccountIds
    refuses them too, but only after Pulumi started, with the provider's words)."""
    if expected is None:
        raise StackError(f"Pulumi.{stack}.yaml has no {ACCOUNT_ID_KEY}: set it to the 12-digit id of the "
                         "AWS account the stack lives in (quoted)")
    if caller_account != expected:
        raise StackError(f"stack {stack!r} lives in AWS account {expected} ({ACCOUNT_ID_KEY} in "
                         f"Pulumi.{stack}.yaml), but these credentials are of account {caller_account}: "
                         "switch AWS_PROFILE to that account, or correct the stack file")


def require_stack_account(stack: str, work_dir: Path = REPO_ROOT) -> None:
    """The STS caller identity's account against the stack's `ringtrain:accountId`."""
    import boto3

    try:
        account = boto3.client("sts").get_caller_identity()["Account"]
    except Exception as exc:  # botocore's error text (expired token, no network) is the reason
        raise StackError(
            f"could not read the caller's AWS account (sts get-caller-identity): {exc}") from None
    check_caller_account(stack, stack_account_id(stack, work_dir), account)


def require_aws_credentials() -> None:
    """Fail early, before Pulumi starts, when boto3's default chain finds no credentials."""
    import boto3

    if boto3.session.Session().get_credentials() is None:
        raise StackError("no AWS credentials found: set AWS_PROFILE (after `aws sso login` or "
                         "`aws configure`) or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; "
                         "without them only `plan` works (offline)")


class StackOps(Protocol):
    """What the lifecycle logic needs from a stack. `set_config` sets a run-time value for the next
    up/destroy of this object; it never writes Pulumi.<stack>.yaml."""

    name: str

    def set_config(self, key: str, value: str) -> None: ...
    def get_config(self, key: str) -> str | None: ...
    def up(self) -> None: ...
    def destroy(self) -> None: ...
    def outputs(self) -> dict[str, Any]: ...
    def last_update(self) -> dict[str, Any] | None: ...


class AutomationStack:
    """StackOps over the Automation API (needs the Pulumi CLI; AWS credentials for up/destroy)."""

    def __init__(self, stack: str, *, work_dir: Path = REPO_ROOT, on_output: Callable[[str], Any] = print,
                 create: bool = True, force: bool = False):
        require_pulumi_cli()
        from pulumi import automation as auto

        self._auto = auto
        self.name = stack
        self._on_output = on_output
        self._work_dir = Path(work_dir)
        self._run_config: dict[str, str] = {}
        self.force = force  # up may roll GPU groups that have nodes (check_no_roll_under_jobs)
        if not (Path(work_dir) / "Pulumi.yaml").exists():
            raise StackError(f"{work_dir} has no Pulumi.yaml: run from the repository")
        try:
            select = auto.create_or_select_stack if create else auto.select_stack
            self._stack = select(stack_name=stack, work_dir=str(work_dir))
        except auto.StackNotFoundError:
            raise StackError(f"stack {stack!r} does not exist in this Pulumi backend: "
                             f"`scripts/up --stack {stack}` creates it") from None
        except auto.CommandError as exc:
            raise StackError(f"pulumi could not select stack {stack!r}: {_command_message(exc)}") from None

    def set_config(self, key: str, value: str) -> None:
        self._run_config[key] = value

    def get_config(self, key: str) -> str | None:
        if key in self._run_config:
            return self._run_config[key]
        try:
            return self._stack.get_config(key).value
        except self._auto.CommandError:
            return None

    def up(self) -> None:
        # --refresh: the state must hold what AWS has now before the diff. A GPU group's desired size
        # is ignore_changes (infra/nodegroups.py), so an update of its min/max sends the desired size
        # last recorded in the state; after job submission or the cost guard resized the group, that
        # stale value would resize a running group. Refresh reads the live size first.
        require_stack_account(self.name, self._work_dir)
        try:
            with run_config_file(self._work_dir, self.name, self._run_config) as config_file:
                if self._run_config.get(COMPUTE_KEY) != "false":
                    for note in require_quotas(self.name, self._work_dir, self._service_quotas()):
                        self._on_output(f"ringtrain: {note}\n")
                self._refuse_rolling_busy_groups(config_file)
                self._stack.up(on_output=self._on_output, refresh=True, config_file=config_file)
            if self._run_config.get(COMPUTE_KEY) != "false":
                for note in activate_cost_allocation_tags(self._cost_explorer()):
                    self._on_output(f"ringtrain: {note}\n")
        except self._auto.CommandError as exc:
            raise StackError(f"pulumi up of stack {self.name!r} failed: {_command_message(exc)}") from None

    def _service_quotas(self) -> Any:
        return None  # require_quotas makes the region's client

    def _cost_explorer(self) -> Any:
        import boto3

        # Cost Explorer is a global service served from us-east-1.
        return boto3.client("ce", region_name="us-east-1")

    def _refuse_rolling_busy_groups(self, config_file: str) -> None:
        """Preview an `up` of a stack whose compute is up; stop if it would roll a GPU group with nodes."""
        if self.force or self._run_config.get(COMPUTE_KEY) == "false":
            return
        outputs = self.outputs()
        groups = outputs.get("nodeGroups") or {}
        if not outputs.get("clusterName") or not groups:
            return  # nothing runs yet
        steps: list[PlannedStep] = []

        def record(event: Any) -> None:
            pre = getattr(event, "resource_pre_event", None)
            if pre is not None:
                meta = pre.metadata
                steps.append(PlannedStep(str(getattr(meta.op, "value", meta.op)), meta.type, meta.urn,
                                         tuple(meta.diffs or ())))

        self._stack.preview(on_event=record, refresh=True, config_file=config_file)
        rolling = rolling_node_groups(steps, {f"nodes-{g}": g for g in groups})
        if rolling:
            nodes = node_counts(str(outputs["clusterName"]),
                                {g: str(groups[g].get("eksNodeGroupName") or "") for g in rolling})
            check_no_roll_under_jobs(self.name, rolling, nodes,
                                     {g: str(v.get("capacityType")) for g, v in groups.items()}, self.force)

    def destroy(self) -> None:
        require_stack_account(self.name, self._work_dir)
        try:
            with run_config_file(self._work_dir, self.name, self._run_config) as config_file:
                self._stack.destroy(on_output=self._on_output, config_file=config_file)
        except self._auto.CommandError as exc:
            raise StackError(
                f"pulumi destroy of stack {self.name!r} failed: {_command_message(exc)}") from None

    def outputs(self) -> dict[str, Any]:
        return {k: v.value for k, v in self._stack.outputs().items()}

    def last_update(self) -> dict[str, Any] | None:
        info = self._stack.info(show_secrets=False)
        if info is None:
            return None
        return {"kind": info.kind, "result": info.result, "start": str(info.start_time),
                "end": str(info.end_time), "resourceChanges": dict(info.resource_changes or {})}


def run_config_document(stack_settings: Mapping[str, Any], run_config: Mapping[str, str]) -> dict[str, Any]:
    """Pulumi.<stack>.yaml's settings (secrets provider and salt included) with the run's values on top."""
    doc = dict(stack_settings)
    doc["config"] = {**(doc.get("config") or {}), **run_config}
    return doc


@contextmanager
def run_config_file(work_dir: Path, stack: str, run_config: Mapping[str, str]):
    """A temporary copy of Pulumi.<stack>.yaml with the run's values, for `--config-file`; removed after."""
    path = Path(work_dir) / f"Pulumi.{stack}.yaml"
    settings = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    with tempfile.TemporaryDirectory(prefix="ringtrain-run-config-") as tmp:
        out = Path(tmp) / f"Pulumi.{stack}.yaml"
        out.write_text(yaml.safe_dump(run_config_document(settings, run_config), sort_keys=False))
        yield str(out)


# ---------------------------------------------------------------------------------------------
# No GPU node rolls under a running job
# ---------------------------------------------------------------------------------------------

NODE_GROUP_TYPE = "aws:eks/nodeGroup:NodeGroup"
# Node group inputs whose change makes EKS replace every node: a new launch template version (what a
# tag change in the template's tag specifications produces), the Kubernetes or AMI release version
# (EKS user guide "Update a managed node group": a version update replaces the nodes, rolling), and
# the inputs that replace the group itself.
ROLLING_INPUTS = ("launchTemplate", "version", "releaseVersion", "amiType", "instanceTypes",
                  "capacityType", "subnetIds", "nodeRoleArn", "diskSize")
ROLLING_OPS = ("update", "replace", "create-replacement", "delete-replaced")


class PlannedStep(NamedTuple):
    """One step of a preview, as the engine reports it (ResourcePreEvent metadata)."""

    op: str
    type: str
    urn: str
    diffs: tuple[str, ...]


def rolling_node_groups(steps: list[PlannedStep], gpu_groups: Mapping[str, str]) -> list[str]:
    """The GPU groups (config names) an update would roll: `gpu_groups` maps each group's resource name
    (infra/nodegroups.py: nodes-<group>) to its config name."""
    rolling = []
    for step in steps:
        if step.type != NODE_GROUP_TYPE or step.op not in ROLLING_OPS:
            continue
        group = gpu_groups.get(step.urn.rsplit("::", 1)[-1])
        replaced = step.op != "update"
        if group and (replaced or any(d.split(".")[0] in ROLLING_INPUTS for d in step.diffs)) \
                and group not in rolling:
            rolling.append(group)
    return rolling


def check_no_roll_under_jobs(stack: str, rolling: list[str], nodes: Mapping[str, int],
                             capacity_types: Mapping[str, str], force: bool) -> None:
    """Refuse an `up` that would replace the nodes of a GPU group that has nodes (the cost guard scales
    idle groups to zero, so nodes mean a job), unless forced."""
    busy = [g for g in rolling if nodes.get(g, 0) > 0]
    if not busy or force:
        return
    listed = ", ".join(f"{g} ({nodes[g]} node{'s' if nodes[g] != 1 else ''}"
                       + (", Capacity Block" if capacity_types.get(g) == "CAPACITY_BLOCK" else "") + ")"
                       for g in busy)
    raise StackError(
        f"up of stack {stack!r} would replace every node of GPU node group(s) {listed}: a launch template, "
        "Kubernetes or AMI version change rolls the group, ending the jobs on it. Wait until they end (the "
        "cost guard scales idle groups to zero), scale the group to 0 (`aws eks update-nodegroup-config "
        "--scaling-config desiredSize=0`; a Capacity Block group that way first), or run `up --force`")


# ---------------------------------------------------------------------------------------------
# Cost-allocation tags: the budget (infra/budget.py) sees only spend tagged project AND stack, and only
# once both keys are active cost-allocation tags.
# ---------------------------------------------------------------------------------------------

COST_TAG_KEYS = ("project", "stack")
BUDGET_BLIND = ("the stack's budget sees no spend until the cost-allocation tags {keys} are active, and "
                "counts tagged spend only from activation on (AWS Billing: activated tags apply from then, "
                "not to past spend)")


def activate_cost_allocation_tags(ce: Any, keys: tuple[str, ...] = COST_TAG_KEYS) -> list[str]:
    """Activate the budget's tag keys where this account may; return what the operator must know.

    Not a Pulumi resource (aws.costexplorer.CostAllocationTag): a tag key can be activated only once
    billing has seen it, "up to 24 hours" after first use (pulumi-aws CostAllocationTag docs, read
    2026-12-06), so declaring it would fail every new stack's first `up`; and in an AWS Organization
    only the management account may activate tags. So `up` tries after each deployment, and says why
    when it cannot (Cost Explorer ListCostAllocationTags / UpdateCostAllocationTagsStatus)."""
    try:
        listed = ce.list_cost_allocation_tags(TagKeys=list(keys), Type="UserDefined")
        status = {t["TagKey"]: t["Status"] for t in listed.get("CostAllocationTags", [])}
        unseen = [k for k in keys if k not in status]
        inactive = [k for k in keys if status.get(k) == "Inactive"]
        errors = []
        if inactive:
            answer = ce.update_cost_allocation_tags_status(
                CostAllocationTagsStatus=[{"TagKey": k, "Status": "Active"} for k in inactive])
            errors = answer.get("Errors", [])
    except Exception as exc:  # AccessDenied (member account, no ce:* permission), no network
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return [f"could not activate the cost-allocation tags {', '.join(keys)} ({reason}); in an AWS "
                "Organization only the management account may: ask its owner to activate them. "
                + BUDGET_BLIND.format(keys=" and ".join(keys))]
    notes = []
    if inactive and not errors:
        notes.append(f"activated the cost-allocation tags {', '.join(inactive)}: the budget counts tagged "
                     "spend from now on, not before")
    for error in errors:
        notes.append(f"could not activate the cost-allocation tag {error.get('TagKey')}: "
                     f"{error.get('Code')} {error.get('Message')}")
    if unseen:
        notes.append(f"the tag keys {', '.join(unseen)} are not in the billing data yet (they appear up to "
                     "24 hours after first use); the next `up` activates them. "
                     + BUDGET_BLIND.format(keys=" and ".join(keys)))
    elif errors:
        notes.append(BUDGET_BLIND.format(keys=" and ".join(keys)))
    return notes


def quota_value(client: Any, code: str) -> float:
    """A quota's applied value; its AWS default when it was never changed (GetServiceQuota answers
    NoSuchResourceException for some of those)."""
    try:
        return float(client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except Exception as exc:
        if "NoSuchResource" not in f"{type(exc).__name__} {exc}":
            raise
        default = client.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)
        return float(default["Quota"]["Value"])


def require_quotas(stack: str, work_dir: Path = REPO_ROOT, client: Any = None) -> list[str]:
    """Stop (StackError naming the quota) when an EC2 vCPU quota is below what the stack's node groups
    need at maxSize (infra/quotas.py); return notes on what could not be checked."""
    from infra.catalog import load_catalog
    from infra.config import ConfigError, settings_from_engine_config
    from infra.quotas import QuotaError, check_quota_values, quota_needs
    from infra.stacks import engine_config

    path = Path(work_dir) / f"Pulumi.{stack}.yaml"
    config = ((yaml.safe_load(path.read_text()) if path.exists() else None) or {}).get("config") or {}
    try:
        settings = settings_from_engine_config(engine_config(config))
    except ConfigError:
        return []  # the program stops with the config's own message
    needs, unchecked = quota_needs(settings, load_catalog())
    if client is None:
        import boto3

        client = boto3.client("service-quotas", region_name=settings.region)
    values: dict[str, float] = {}
    notes = [f"EC2 vCPU quota not checked for node group {u}" for u in unchecked]
    for need in needs:
        try:
            values[need.code] = quota_value(client, need.code)
        except Exception as exc:  # no servicequotas:GetServiceQuota permission, no network
            reason = " ".join(str(exc).split()) or type(exc).__name__
            notes.append(f"could not read the EC2 quota {need.name} ({need.code}): {reason}; not checked")
    try:
        check_quota_values(needs, values, settings.region)
    except QuotaError as exc:
        raise StackError(str(exc)) from None
    return notes


def node_counts(cluster: str, eks_names: Mapping[str, str]) -> dict[str, int]:
    """Desired size of each node group now (EKS DescribeNodegroup scalingConfig.desiredSize)."""
    import boto3

    eks = boto3.client("eks")
    return {group: int(eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)
                       ["nodegroup"]["scalingConfig"]["desiredSize"])
            for group, name in eks_names.items() if name}


def _command_message(exc: Exception) -> str:
    text = str(exc).strip()
    # CommandError carries the whole CLI transcript; its stderr part is what explains the failure.
    marker = "stderr:"
    if marker in text:
        text = text.split(marker, 1)[1].strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-15:]) or type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Lifecycle logic (tested with a recording StackOps)
# ---------------------------------------------------------------------------------------------


def stack_up(ops: StackOps) -> dict[str, Any]:
    """Compute on, deploy; returns the outputs."""
    ops.set_config(COMPUTE_KEY, "true")
    ops.up()
    return ops.outputs()


def stack_down(ops: StackOps, notify: Callable[[str], Any] = print,
               blocks: Callable[[list[str]], Mapping[str, Mapping[str, Any]]] | None = None) -> None:
    """Compute off, deploy: the cluster and node groups go, the data layer stays. Then say what each
    Capacity Block of the stack still means (`blocks` reads them; default EC2)."""
    ops.set_config(COMPUTE_KEY, "false")
    ops.up()
    groups = capacity_block_groups(ops.name)
    if groups:
        found = (blocks or describe_capacity_blocks)([rid for _, rid in groups])
        for line in capacity_block_notes(groups, found, datetime.now(UTC)):
            notify(line)


def capacity_block_groups(stack: str, work_dir: Path = REPO_ROOT) -> list[tuple[str, str]]:
    """(group, reservation id) of each CAPACITY_BLOCK node group in the committed Pulumi.<stack>.yaml."""
    path = Path(work_dir) / f"Pulumi.{stack}.yaml"
    doc = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    groups = (doc.get("config") or {}).get("ringtrain:nodeGroups") or []
    return [(g["name"], g["capacityReservationId"]) for g in groups
            if isinstance(g, dict) and g.get("capacityType") == "CAPACITY_BLOCK"
            and g.get("capacityReservationId")]


def capacity_block_notes(groups: list[tuple[str, str]], blocks: Mapping[str, Mapping[str, Any]],
                         now: datetime) -> list[str]:
    """What `down` leaves running: a Capacity Block is paid up front and cannot be cancelled ("You can't
    modify or cancel a Capacity Block", EC2 API reference CancelCapacityReservation; read 2026-12-06)."""
    notes = []
    for group, rid in groups:
        block = blocks.get(rid)
        if block is None:
            notes.append(f"Capacity Block {rid} (node group {group}): not found in this account and region; "
                         "check it in the EC2 console (Capacity Reservations)")
            continue
        end = block["EndDate"]
        hours = max(0.0, (end - now).total_seconds() / 3600)
        notes.append(
            f"Capacity Block {rid} (node group {group}, {block.get('InstanceCount')} x "
            f"{block.get('InstanceType')}, {block.get('State')}): paid up front and cannot be cancelled; it "
            f"stays yours until {end.isoformat()} ({hours:.0f} h from now). `down` saves nothing on it "
            "and refunds nothing: `up` again before then to use it.")
    return notes


def describe_capacity_blocks(reservation_ids: list[str]) -> dict[str, Mapping[str, Any]]:
    """EC2 DescribeCapacityReservations for the given ids (a missing one is left out)."""
    import boto3

    found: dict[str, Mapping[str, Any]] = {}
    ec2 = boto3.client("ec2")
    for rid in reservation_ids:
        try:
            reservations = ec2.describe_capacity_reservations(CapacityReservationIds=[rid])
        except Exception:  # not found / no permission: the note says so
            continue
        for r in reservations.get("CapacityReservations", []):
            found[r["CapacityReservationId"]] = r
    return found


def purge_data_layer(outputs: Mapping[str, Any]) -> None:
    """Delete every object version and delete marker of both buckets and every image of the repository,
    so that destroy can remove them (S3 and ECR refuse to delete non-empty buckets and repositories)."""
    import boto3

    s3 = boto3.client("s3")
    for key in ("datasetsBucket", "checkpointsBucket"):
        bucket = outputs.get(key)
        if not bucket:
            continue
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
            doomed = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                      for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
            for i in range(0, len(doomed), 1000):  # DeleteObjects takes at most 1000 keys
                s3.delete_objects(Bucket=bucket, Delete={"Objects": doomed[i:i + 1000], "Quiet": True})
    url = outputs.get("ecrRepositoryUrl")
    if url:
        ecr = boto3.client("ecr")
        repo = str(url).split("/", 1)[1]
        for page in ecr.get_paginator("list_images").paginate(repositoryName=repo):
            ids = page.get("imageIds", [])
            for i in range(0, len(ids), 100):  # BatchDeleteImage takes at most 100 ids
                ecr.batch_delete_image(repositoryName=repo, imageIds=ids[i:i + 100])


def delete_data(ops: StackOps, *, confirm: str | None, ask: Callable[[str], str] | None,
                purge: Callable[[Mapping[str, Any]], None] = purge_data_layer) -> None:
    """Remove everything, data included, after the stack name is typed (or given as `confirm`)."""
    if confirm is None:
        if ask is None:
            raise StackError(f"deleting the data layer of stack {ops.name!r} needs a typed confirmation: "
                             f"run interactively or pass --confirm {ops.name}")
        confirm = ask(f"This deletes stack {ops.name!r} INCLUDING its datasets, checkpoints, images and "
                      f"KMS key.\nType the stack name ({ops.name}) to confirm: ")
    if confirm.strip() != ops.name:
        raise StackError(f"confirmation {confirm.strip()!r} does not match stack name {ops.name!r}: "
                         "nothing was deleted")
    ops.set_config(COMPUTE_KEY, "false")
    ops.set_config(DATA_PROTECTION_KEY, "false")
    ops.up()        # lifts protect= on the data layer in the state; destroy refuses protected resources
    purge(ops.outputs())
    ops.destroy()


def stack_status(ops: StackOps) -> dict[str, Any]:
    outputs = ops.outputs()
    public = {k: ("[secret]" if k == "kubeconfig" else v) for k, v in sorted(outputs.items())}
    return {
        "stack": ops.name,
        # What is deployed, not a setting: compute is a run-time value of up/down (module docstring).
        "compute": "true" if outputs.get("clusterName") else "false",
        "dataProtection": ops.get_config(DATA_PROTECTION_KEY),
        "lastUpdate": ops.last_update(),
        "outputs": public,
    }


def default_kubeconfig_path(stack: str) -> Path:
    return Path.home() / ".kube" / f"ringtrain-{stack}.yaml"


def write_kubeconfig(outputs: Mapping[str, Any], path: Path, *, stack: str) -> Path:
    """Write the stack's (secret) kubeconfig output to `path`, readable by its owner only (0600)."""
    value = outputs.get("kubeconfig")
    if not value:
        raise StackError(f"stack {stack!r} has no kubeconfig output: its compute is down; "
                         f"run `scripts/up --stack {stack}`")
    text = value if isinstance(value, str) else yaml.safe_dump(value, sort_keys=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created 0600 from the start (no window where others could read the credentials), and fixed to 0600
    # if the file existed with a wider mode.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return path
