"""Run the real Pulumi program (infra/__main__.py) offline under Pulumi mocks and capture what it declares.

Test machinery only: it drives Pulumi's runtime through private internals (`_sync_await`,
`SETTINGS.rpc_manager`, a `gc.get_objects()` sweep after a failed run), which a Pulumi upgrade may
change; the product code does not depend on it (the offline plan, cluster/aws/plan.py, is a pure
function of the validated config and the catalog, and tests/cluster/test_plan.py checks it against
what this harness captures).

    result = run_program("prod")                      # a committed stack: Pulumi.prod.yaml
    result = run_program(config={...}, stack="t")     # any config dict (keys "ringtrain:...", "aws:region")
    vpc = result.one("aws:ec2/vpc:Vpc")
    result.exports["vpcId"]

The program runs exactly as the Pulumi language host runs it (runpy on infra/__main__.py), inside
`run_pulumi_func`, which waits for every RPC and every pending Output before returning; so tests get
plain Python data and need no `@pulumi.runtime.test` (docs/field-notes.md §7). Inputs are recorded as the
engine would receive them: camelCased keys, numbers as floats, provider object inputs JSON-encoded.

Invokes are answered from INVOKES (token -> function(args, region) -> dict); an invoke without an
answer fails the run naming its token, so a test never passes on a silently empty result. Capacity
Block lookups are answered from the config itself (capacity_blocks_as_configured).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import runpy
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra.stacks import REPO_ROOT, engine_config, stack_config, stack_names

PROGRAM = REPO_ROOT / "infra" / "__main__.py"
PROJECT = "ringtrain"
ACCOUNT_ID = "123456789012"
# Every committed Pulumi.<stack>.yaml: the rule tests run over each, so a new stack file is covered.
COMMITTED_STACKS = tuple(stack_names())


class HarnessError(Exception):
    """The harness itself could not answer (an unmocked invoke, a duplicate URN)."""


# --------------------------------------------------------------------------------------------
# Captured resources
# --------------------------------------------------------------------------------------------


@dataclass
class CapturedResource:
    type: str
    name: str
    urn: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    id: str | None
    parent: str  # URN of the parent ("" only for the stack itself)
    provider: str  # provider reference "urn::id"; "" means the engine's default provider
    custom: bool
    protect: bool | None
    retain_on_delete: bool | None
    dependencies: list[str] = field(default_factory=list)
    ignore_changes: list[str] = field(default_factory=list)
    providers: dict[str, str] = field(default_factory=dict)  # component `providers=` map
    # Added by infra-compute: node groups with fixed names must be replaced delete-first.
    delete_before_replace: bool = False
    aliases: list[str] = field(default_factory=list)  # alias URNs (full-URN aliases as sent)
    deleted_with: str = ""  # URN of the resource whose deletion makes this one's delete call unneeded

    @property
    def provider_urn(self) -> str:
        """URN of the explicit provider ("" for the engine's default provider)."""
        return self.provider.rsplit("::", 1)[0] if self.provider else ""


@dataclass
class ProgramResult:
    stack: str
    config: dict[str, Any]
    resources: list[CapturedResource]
    exports: dict[str, Any]
    secret_exports: set[str]

    def of_type(self, type_: str) -> list[CapturedResource]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> CapturedResource:
        matches = [r for r in self.of_type(type_) if name is None or r.name == name]
        if len(matches) != 1:
            names = [r.name for r in self.of_type(type_)]
            raise AssertionError(f"expected exactly one {type_}{' ' + name if name else ''}, found {names}")
        return matches[0]

    def by_urn(self, urn: str) -> CapturedResource:
        for r in self.resources:
            if r.urn == urn:
                return r
        raise KeyError(urn)

    def children(self, parent: CapturedResource) -> list[CapturedResource]:
        return [r for r in self.resources if r.parent == parent.urn]

    def ancestors(self, res: CapturedResource) -> list[CapturedResource]:
        chain, urn = [], res.parent
        seen: set[str] = set()
        while urn and urn not in seen:
            seen.add(urn)
            try:
                parent = self.by_urn(urn)
            except KeyError:
                break
            chain.append(parent)
            urn = parent.parent
        return chain

    def types(self) -> set[str]:
        return {r.type for r in self.resources}


# --------------------------------------------------------------------------------------------
# Mocks
# --------------------------------------------------------------------------------------------


def _az_names(region: str) -> list[str]:
    return [f"{region}{letter}" for letter in "abcdef"]


def _get_availability_zones(args: dict, region: str) -> dict:
    names = _az_names(region)
    return {
        "names": names,
        "zoneIds": [f"use1-az{i + 1}" for i in range(len(names))],
        "groupNames": [region] * len(names),
        "id": region,
        "region": region,
        "state": args.get("state", "available"),
    }


def _get_region(args: dict, region: str) -> dict:
    return {
        "name": region,
        "region": region,
        "id": region,
        "endpoint": f"ec2.{region}.amazonaws.com",
        "description": region,
    }


def _get_caller_identity(args: dict, region: str) -> dict:
    return {
        "accountId": ACCOUNT_ID,
        "arn": f"arn:aws:iam::{ACCOUNT_ID}:user/ringtrain-test",
        "userId": "AIDATESTUSER",
        "id": ACCOUNT_ID,
    }


def _get_session_context(args: dict, region: str) -> dict:
    """aws.iam.get_session_context: an assumed-role session's issuer role; other ARNs pass through."""
    arn = args["arn"]
    parts = arn.split(":")
    if parts[2] == "sts" and parts[5].startswith("assumed-role/"):
        _, role, session = parts[5].split("/", 2)
        issuer = f"arn:aws:iam::{parts[4]}:role/{role}"
        return {"arn": arn, "issuerArn": issuer, "issuerId": "AROATESTROLE", "issuerName": role,
                "sessionName": session, "id": arn}
    return {"arn": arn, "issuerArn": arn, "issuerId": "", "issuerName": parts[5].rsplit("/", 1)[-1],
            "sessionName": "", "id": arn}


def _get_partition(args: dict, region: str) -> dict:
    return {
        "partition": "aws",
        "dnsSuffix": "amazonaws.com",
        "reverseDnsPrefix": "com.amazonaws",
        "id": "aws",
    }


def _get_ssm_parameter(args: dict, region: str) -> dict:
    name = args.get("name", "")
    return {"name": name, "value": "ami-0123456789abcdef0", "insecureValue": "ami-0123456789abcdef0",
            "type": "String", "version": 1.0, "arn": f"arn:aws:ssm:{region}:{ACCOUNT_ID}:parameter{name}",
            "id": name}


def _get_ami(args: dict, region: str) -> dict:
    return {"id": "ami-0123456789abcdef0", "imageId": "ami-0123456789abcdef0", "name": "mock-ami",
            "architecture": "x86_64", "rootDeviceName": "/dev/xvda"}


def _get_addon_version(args: dict, region: str) -> dict:
    """EKS DescribeAddonVersions' default for an add-on and Kubernetes version (offline: a marker)."""
    version = f"v0.0.0-offline-default-{args['addonName']}-{args['kubernetesVersion']}"
    return {"addonName": args["addonName"], "kubernetesVersion": args["kubernetesVersion"],
            "version": version, "id": args["addonName"]}


# token -> (args, region) -> result. Extend (additively) when the program starts calling more.
INVOKES: dict[str, Callable[[dict, str], dict]] = {
    "aws:index/getAvailabilityZones:getAvailabilityZones": _get_availability_zones,
    "aws:index/getRegion:getRegion": _get_region,
    "aws:index/getCallerIdentity:getCallerIdentity": _get_caller_identity,
    "aws:iam/getSessionContext:getSessionContext": _get_session_context,
    "aws:index/getPartition:getPartition": _get_partition,
    "aws:ssm/getParameter:getParameter": _get_ssm_parameter,
    "aws:ec2/getAmi:getAmi": _get_ami,
    "aws:eks/getAddonVersion:getAddonVersion": _get_addon_version,
}


CAPACITY_BLOCK_INVOKE = "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation"


def capacity_blocks_as_configured(config: Mapping[str, Any]) -> Callable[[dict, str], dict]:
    """Offline answer to Capacity Block lookups: each block is what its node group's config says (in
    network.gpuAvailabilityZone, of the group's instance type, maxSize instances, active). Offline
    there is no AWS to ask: only `pulumi preview`/`up` read the real block. Tests that need another
    block pass their own answer for CAPACITY_BLOCK_INVOKE."""
    def value(key: str) -> Any:
        raw = config.get(f"ringtrain:{key}")
        return json.loads(raw) if isinstance(raw, str) else raw

    network = value("network") or {}
    blocks = {g["capacityReservationId"]: g for g in (value("nodeGroups") or [])
              if isinstance(g, dict) and g.get("capacityType") == "CAPACITY_BLOCK"
              and g.get("capacityReservationId")}

    def answer(args: dict, region: str) -> dict:
        group = blocks.get(args.get("id"))
        if group is None:
            raise HarnessError(f"no Capacity Block {args.get('id')!r} in the config's node groups")
        return {"id": args["id"], "availabilityZone": network.get("gpuAvailabilityZone"),
                "instanceType": group["instanceTypes"][0], "instanceCount": group["maxSize"],
                "state": "active", "reservationType": "capacity-block",
                "startDate": "2026-12-01T11:30:00Z", "endDate": "2026-12-08T11:30:00Z"}
    return answer


CALLER_INVOKE = "aws:index/getCallerIdentity:getCallerIdentity"


def caller_as_first_admin(config: Mapping[str, Any]) -> Callable[[dict, str], dict]:
    """Offline caller identity: the config's first cluster admin (a session of it, for a role), so that
    a committed stack runs as one of its listed operators. A config without admins keeps the default."""
    raw = config.get("ringtrain:cluster")
    cluster = json.loads(raw) if isinstance(raw, str) else (raw or {})
    admins = cluster.get("adminPrincipalArns") or []
    if not admins or not str(admins[0]).startswith("arn:") or str(admins[0]).count(":") < 5:
        return _get_caller_identity  # no (valid) admin: config validation stops the run anyway
    first = admins[0]
    account = first.split(":")[4]
    kind, _, name = first.split(":", 5)[5].partition("/")
    arn = (f"arn:aws:sts::{account}:assumed-role/{name.rsplit('/', 1)[-1]}/offline-test" if kind == "role"
           else first)

    def answer(args: dict, region: str) -> dict:
        return {"accountId": account, "arn": arn, "userId": "AROAOFFLINE", "id": account}
    return answer


EKS_CLUSTERS_INVOKE = "aws:eks/getClusters:getClusters"
EKS_CLUSTER_INVOKE = "aws:eks/getCluster:getCluster"


def clusters_existing(stack: str) -> dict[str, Callable[[dict, str], dict]]:
    """Offline answers to the private-endpoint check's lookups: the stack's cluster exists (the plan
    models an update run from where its endpoint answers). Tests of a first `up` answer `names: []`."""
    from infra.cluster import cluster_name

    name = cluster_name(stack)

    def clusters(args: dict, region: str) -> dict:
        return {"names": [name], "id": region}

    def cluster(args: dict, region: str) -> dict:
        if args.get("name") != name:
            raise HarnessError(f"no EKS cluster {args.get('name')!r} offline (only {name!r})")
        return {"name": name, "id": name, "endpoint": f"https://{name}.gr7.{region}.eks.amazonaws.com",
                "arn": f"arn:aws:eks:{region}:{ACCOUNT_ID}:cluster/{name}", "status": "ACTIVE"}

    return {EKS_CLUSTERS_INVOKE: clusters, EKS_CLUSTER_INVOKE: cluster}


def _service_of(type_: str) -> str:
    # "aws:ec2/vpc:Vpc" -> "ec2"
    try:
        return type_.split(":", 2)[1].split("/")[0]
    except IndexError:
        return "unknown"


def _default_outputs(type_: str, name: str, inputs: dict, region: str, rid: str) -> dict:
    """Computed outputs a real provider would return and that programs commonly read."""
    service = _service_of(type_)
    out: dict[str, Any] = {
        "arn": f"arn:aws:{service}:{region}:{ACCOUNT_ID}:{type_.rsplit(':', 1)[-1].lower()}/{name}",
    }
    if type_ == "aws:s3/bucket:Bucket":
        bucket = inputs.get("bucket") or name
        out.update(bucket=bucket, arn=f"arn:aws:s3:::{bucket}", bucketDomainName=f"{bucket}.s3.amazonaws.com",
                   bucketRegionalDomainName=f"{bucket}.s3.{region}.amazonaws.com", region=region)
    elif type_ == "aws:ecr/repository:Repository":
        repo = inputs.get("name") or name
        out.update(name=repo, repositoryUrl=f"{ACCOUNT_ID}.dkr.ecr.{region}.amazonaws.com/{repo}",
                   registryId=ACCOUNT_ID, arn=f"arn:aws:ecr:{region}:{ACCOUNT_ID}:repository/{repo}")
    elif type_ == "aws:kms/key:Key":
        out.update(keyId=rid, arn=f"arn:aws:kms:{region}:{ACCOUNT_ID}:key/{rid}")
    elif type_ == "aws:iam/role:Role":
        role = inputs.get("name") or name
        out.update(name=role, arn=f"arn:aws:iam::{ACCOUNT_ID}:role/{role}", uniqueId=f"AROA{rid[-12:]}")
    elif type_ == "aws:iam/policy:Policy":
        out.update(arn=f"arn:aws:iam::{ACCOUNT_ID}:policy/{inputs.get('name') or name}")
    elif type_ == "aws:cloudwatch/logGroup:LogGroup":
        group = inputs.get("name") or name
        out.update(name=group, arn=f"arn:aws:logs:{region}:{ACCOUNT_ID}:log-group:{group}")
    elif type_ == "aws:eks/cluster:Cluster":
        cname = inputs.get("name") or name
        out.update(
            name=cname,
            endpoint=f"https://{rid}.gr7.{region}.eks.amazonaws.com",
            certificateAuthority={"data": "bW9jay1jYQ=="},
            identities=[{"oidcs": [{"issuer": f"https://oidc.eks.{region}.amazonaws.com/id/{rid.upper()}"}]}],
            vpcConfig={**(inputs.get("vpcConfig") or {}), "clusterSecurityGroupId": "sg-cluster0000000000"},
            arn=f"arn:aws:eks:{region}:{ACCOUNT_ID}:cluster/{cname}",
        )
    elif type_ == "aws:ec2/launchTemplate:LaunchTemplate":
        out.update(latestVersion=1.0, defaultVersion=1.0)
    elif type_ == "aws:sns/topic:Topic":
        out.update(arn=f"arn:aws:sns:{region}:{ACCOUNT_ID}:{inputs.get('name') or name}")
    return out


class _RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self, region: str, invokes: Mapping[str, Callable[[dict, str], dict]]):
        self.region = region
        self.invokes = dict(invokes)
        self.invoked: list[tuple[str, dict]] = []
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        # Ids depend on type and name only, so two runs of the program give equal inputs (a stack with
        # compute off can be compared with one with compute on); a clash gets a counter.
        base = args.resource_id or f"{args.name}-{hashlib.sha1(args.typ.encode()).hexdigest()[:8]}"
        with self._lock:
            rid, n = base, 1
            while rid in self._ids:
                n += 1
                rid = f"{base}-{n}"
            self._ids.add(rid)
        if args.typ.startswith("pulumi:providers:"):
            return rid, dict(args.inputs)
        state = {**_default_outputs(args.typ, args.name, args.inputs, self.region, rid), **args.inputs}
        if args.typ == "aws:kms/key:Key":
            state["arn"] = f"arn:aws:kms:{self.region}:{ACCOUNT_ID}:key/{rid}"
        state.setdefault("id", rid)
        return rid, state

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.invoked.append((args.token, dict(args.args)))
        fn = self.invokes.get(args.token)
        if fn is None:
            raise HarnessError(
                f"the test harness has no mock answer for invoke {args.token!r}; add one to "
                f"tests/infra/harness.py INVOKES "
                f"(answered: {sorted(t for t, f in self.invokes.items() if f)})"
            )
        return fn(dict(args.args), self.region), []


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    """MockMonitor that also keeps parent, provider and resource options of every registration."""

    def __init__(self, mocks: _RecordingMocks):
        super().__init__(mocks)
        self.captured: dict[str, CapturedResource] = {}
        self._lock = threading.Lock()

    def RegisterResource(self, request):
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type != "pulumi:pulumi:Stack":
            with self._lock:
                if urn in self.captured:
                    raise HarnessError(f"duplicate resource URN {urn} (two resources with one type and name)")
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        inputs = pulumi_mocks.rpc.deserialize_properties(request.object)
        reg = self.resources[urn]
        captured = CapturedResource(
            type=request.type,
            name=request.name,
            urn=urn,
            inputs=dict(inputs),
            outputs=dict(reg.state),
            id=reg.id,
            parent=request.parent,
            provider=request.provider,
            custom=bool(request.custom),
            protect=request.protect if request.HasField("protect") else None,
            retain_on_delete=request.retainOnDelete if request.HasField("retainOnDelete") else None,
            dependencies=list(request.dependencies),
            ignore_changes=list(request.ignoreChanges),
            providers=dict(request.providers),
            delete_before_replace=bool(request.deleteBeforeReplace),
            aliases=[a.urn for a in request.aliases if a.urn] + list(request.aliasURNs),
            deleted_with=request.deletedWith,
        )
        with self._lock:
            self.captured[urn] = captured
        return response

    def ReadResource(self, request):
        raise HarnessError(f"the program reads an existing resource ({request.type} {request.name}); "
                           "the harness does not model reads")


# --------------------------------------------------------------------------------------------
# Running the program
# --------------------------------------------------------------------------------------------


def _retrieve_failed_futures() -> None:
    """Mark the error of every asyncio future as retrieved, now for those done and on completion for
    those still pending (the failed run's outputs go on failing after its error is raised)."""
    gc.collect()
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.Future):
            if obj.done():
                _retrieve(obj)
            else:
                obj.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


_RUN_LOCK = threading.Lock()  # the Pulumi runtime's settings are process-global


def run_program(
    stack: str = "dev",
    config: Mapping[str, Any] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    invokes: Mapping[str, Callable[[dict, str], dict]] | None = None,
    secret_keys: Iterable[str] = (),
    endpoint_reachable: bool = True,
) -> ProgramResult:
    """Run infra/__main__.py for one stack under mocks; return every registered resource and the exports.

    stack:     stack name; without `config` its Pulumi.<stack>.yaml is loaded.
    config:    a whole config mapping instead of the committed file ("aws:region", "ringtrain:...").
    overrides: keys replaced on top of the loaded config (a value None removes the key).
    endpoint_reachable: what the private-endpoint check's TCP probe (infra.cluster.endpoint_reachable)
               answers; offline runs never open a connection.
    Exceptions raised by the program (e.g. pulumi.RunError for a bad config) propagate unchanged.
    """
    cfg = dict(stack_config(stack) if config is None else config)
    for key, value in (overrides or {}).items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    region = str(cfg.get("aws:region", "us-east-1"))

    with _RUN_LOCK:
        answers = {**INVOKES, CALLER_INVOKE: caller_as_first_admin(cfg),
                   CAPACITY_BLOCK_INVOKE: capacity_blocks_as_configured(cfg),
                   **clusters_existing(stack), **(invokes or {})}
        mocks = _RecordingMocks(region, answers)
        monitor = _RecordingMonitor(mocks)
        set_all_config(engine_config(cfg), list(secret_keys))
        pulumi_settings.ROOT.set(None)
        pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
        pulumi_settings.SETTINGS.rpc_manager.clear()
        pulumi_settings.SETTINGS.outputs.clear()
        root = pulumi_settings.get_root_resource()

        exports: dict[str, Any] = {}
        secret_exports: set[str] = set()

        async def program() -> None:
            runpy.run_path(str(PROGRAM), run_name="__main__")
            for key, value in dict(root.outputs).items():
                out = pulumi.Output.from_input(value)
                exports[key] = await out.future()
                if await out.is_secret():
                    secret_exports.add(key)

        import infra.cluster as cluster_module

        real_probe = cluster_module.endpoint_reachable
        cluster_module.endpoint_reachable = lambda endpoint, timeout_s=5.0: endpoint_reachable
        try:
            _sync_await(run_pulumi_func(program))
        except BaseException as exc:
            # What was registered before the failure (a bad config must leave this empty).
            exc.harness_resources = list(monitor.captured.values())  # type: ignore[attr-defined]
            # Drop the failed run's pending work, and mark its failed futures' errors as seen: the
            # error is the one raised here, and asyncio would otherwise log each future's copy of it
            # when the future is collected (~240 tracebacks at the end of the suite's output).
            pulumi_settings.SETTINGS.rpc_manager.clear()
            pulumi_settings.SETTINGS.outputs.clear()
            _retrieve_failed_futures()
            raise
        finally:
            cluster_module.endpoint_reachable = real_probe
        resources = list(monitor.captured.values())

    return ProgramResult(stack=stack, config=cfg, resources=resources, exports=exports,
                         secret_exports=secret_exports)
