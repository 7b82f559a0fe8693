"""The self-test: what a training run silently depends on, checked on the node (see image/entrypoint.py's
docstring for the list); pure parsing and decisions first, then the thin functions that gather the facts
through a Host. Also the allreduce rank those checks start through horovodrun."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringtrain_entry.host import Host
from ringtrain_entry.settings import (
    CHECK_BUILD_SECTIONS,
    EXIT_OK,
    EXIT_SELFTEST_FAILED,
    Settings,
    efa_expected,
)

# The script whose `allreduce-worker` mode each rank of the allreduce check runs (this package's parent).
ENTRYPOINT_SCRIPT = Path(__file__).resolve().parents[1] / "entrypoint.py"
ALLREDUCE_OK = "RINGTRAIN_ALLREDUCE_OK"
# NCCL's log of its network, with NCCL_DEBUG=INFO. The EFA pattern is the one AWS's own health check
# greps after its NCCL allreduce (aws-samples/awsome-distributed-training,
# 4.validation_and_observability/2.gpu-cluster-healthcheck/checks/5-nccl-allreduce.sh:
# `grep -qi "Selected Provider is efa\|Using network EFA"` with NCCL_DEBUG=INFO): aws-ofi-nccl logs
# "NET/OFI Selected provider is efa, fabric is ..." when it loads; NCCL logs "Using network <name>",
# "Socket" when it fell back to TCP.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
NCCL_USES_EFA = re.compile(r"Selected Provider is efa|Using network EFA", re.IGNORECASE)
NCCL_NETWORK = re.compile(r"Using network (.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    skipped: bool = False

    def line(self) -> str:
        status = "SKIP" if self.skipped else ("PASS" if self.ok else "FAIL")
        return f"selftest: {status} {self.name}: {self.detail}"



def parse_check_build(text: str) -> dict[str, dict[str, bool]]:
    """`horovodrun --check-build` output -> {section: {name: built?}}."""
    sections: dict[str, dict[str, bool]] = {}
    current = None
    for line in text.splitlines():
        header = re.fullmatch(r"\s*(Available [A-Za-z ]+):\s*", line)
        if header:
            current = sections.setdefault(header.group(1), {})
            continue
        item = re.fullmatch(r"\s*\[([ X])\]\s+(\S+)\s*", line)
        if item and current is not None:
            current[item.group(2)] = item.group(1) == "X"
    return sections


def missing_from_build(sections: Mapping[str, Mapping[str, bool]], require: Sequence[str]) -> list[str]:
    return [name for name in require if not sections.get(CHECK_BUILD_SECTIONS[name], {}).get(name, False)]


def count_nvidia_smi_gpus(text: str) -> int:
    """`nvidia-smi -L` prints one 'GPU <n>: <name> (UUID: ...)' line per visible GPU."""
    return sum(1 for line in text.splitlines() if re.match(r"GPU \d+:", line.strip()))


def efa_devices(sysfs_infiniband: Path) -> list[str]:
    """RDMA devices whose kernel driver is efa (their names, e.g. rdmap16s27, do not say so)."""
    if not sysfs_infiniband.is_dir():
        return []
    found = []
    for dev in sorted(sysfs_infiniband.iterdir()):
        driver = dev / "device" / "driver"
        if driver.exists() and driver.resolve().name == "efa":
            found.append(dev.name)
    return found


def fi_info_has_efa(text: str) -> bool:
    return re.search(r"^\s*provider:\s*efa\s*$", text, re.MULTILINE) is not None


def plan_allreduce(gpu_count: int, efa: bool) -> tuple[str, int]:
    """(device, ranks): NCCL wants one GPU per rank, so all visible GPUs each get one; two GPUs, or one
    when EFA must be shown in use (only NCCL can show it), test the NCCL path; otherwise two Gloo ranks on
    CPU. Horovod runs a one-rank GPU allreduce through NCCL too (ncclCommInitRank with size 1:
    horovod/common/ops/nccl_operations.cc NCCLAllreduce::Execute has no single-rank shortcut)."""
    if gpu_count >= 2 or (efa and gpu_count == 1):
        return "cuda", gpu_count
    return "cpu", 2


def nccl_network(text: str) -> str | None:
    """The network NCCL said it uses ("Using network AWS Libfabric", "... Socket"), the last one logged."""
    found = NCCL_NETWORK.findall(text)
    return found[-1] if found else None


def check_nccl_uses_efa(output: str, device: str) -> CheckResult:
    name = "nccl over efa"
    if device != "cuda":
        return CheckResult(name, False, "not run: NCCL needs a visible GPU (see the gpus check)")
    if NCCL_USES_EFA.search(output):
        match = next(line for line in output.splitlines() if NCCL_USES_EFA.search(line))
        start = match.find("NCCL INFO")
        return CheckResult(name, True, match[max(start, 0):].strip()[:200])
    network = nccl_network(output)
    said = f"NCCL used network {network!r}" if network else "NCCL logged no network (did it start?)"
    return CheckResult(name, False, f"{said}, not the EFA provider: the job would run over TCP. Check that "
                       "the entrypoint applied the efa network section (RINGTRAIN_NETWORK=efa: "
                       "NCCL_NET_PLUGIN=ofi), /opt/amazon/ofi-nccl/lib is on LD_LIBRARY_PATH and the pod "
                       "requests vpc.amazonaws.com/efa")


def check_horovod_build(host: Host, settings: Settings) -> CheckResult:
    name = "horovod check-build"
    horovodrun = host.which("horovodrun")
    if not horovodrun:
        return CheckResult(name, False, "horovodrun is not installed (not on PATH)")
    res = host.run([horovodrun, "--check-build"], settings.timeout_s)
    if res.rc != 0:
        return CheckResult(name, False, f"horovodrun --check-build exited {res.rc}: {res.out.strip()[-300:]}")
    missing = missing_from_build(parse_check_build(res.out), settings.require)
    if missing:
        return CheckResult(name, False, f"Horovod was built without {', '.join(missing)}")
    return CheckResult(name, True, "built with " + ", ".join(settings.require))


def visible_gpus(host: Host, timeout_s: float) -> tuple[int, str]:
    smi = host.which("nvidia-smi")
    if smi:
        res = host.run([smi, "-L"], timeout_s)
        if res.rc == 0:
            return count_nvidia_smi_gpus(res.out), "nvidia-smi"
    res = host.run([host.python, "-c", "import torch; print(torch.cuda.device_count())"], timeout_s)
    if res.rc == 0 and res.out.strip().splitlines() and res.out.strip().splitlines()[-1].isdigit():
        return int(res.out.strip().splitlines()[-1]), "torch.cuda"
    return 0, "no nvidia-smi and torch.cuda unavailable"


def check_gpus(count: int, source: str, expect: int | None) -> CheckResult:
    name = "gpus"
    if expect == 0:
        return CheckResult(name, True, "not expected (RINGTRAIN_EXPECT_GPUS=0)", skipped=True)
    need = 1 if expect is None else expect
    ok = count >= need
    return CheckResult(name, ok, f"{count} visible ({source}), need at least {need}")


def check_efa(host: Host, settings: Settings) -> CheckResult:
    name = "efa"
    if settings.expect_efa == 0:
        return CheckResult(name, True, "not expected (RINGTRAIN_EXPECT_EFA=0)", skipped=True)
    devices = efa_devices(host.sysfs_infiniband)
    if settings.expect_efa is None and not devices:
        detail = f"no EFA devices in {host.sysfs_infiniband}; none expected"
        return CheckResult(name, True, detail, skipped=True)
    need = 1 if settings.expect_efa is None else settings.expect_efa
    if len(devices) < need:
        return CheckResult(name, False, f"{len(devices)} EFA devices in {host.sysfs_infiniband}, need {need}"
                           " (does the pod request vpc.amazonaws.com/efa?)")
    fi_info = host.which("fi_info")
    if not fi_info:
        return CheckResult(name, False, f"{len(devices)} EFA devices but fi_info is not installed")
    res = host.run([fi_info, "-p", "efa", "-t", "FI_EP_RDM"], settings.timeout_s)
    if res.rc != 0 or not fi_info_has_efa(res.out):
        tail = res.out.strip()[-300:]
        detail = f"{len(devices)} EFA devices but libfabric's efa provider is not usable: {tail}"
        return CheckResult(name, False, detail)
    listed = ", ".join(devices)
    return CheckResult(name, True, f"{len(devices)} EFA devices ({listed}), libfabric efa provider ok")


def parse_allreduce_ranks(text: str) -> set[int]:
    return {int(m.group(1)) for m in re.finditer(ALLREDUCE_OK + r" rank=(\d+)", text)}


def check_allreduce(host: Host, settings: Settings, device: str, ranks: int = 2) -> tuple[CheckResult, str]:
    """The allreduce through horovodrun, and its whole output (NCCL's log lines included on GPUs)."""
    name = f"allreduce ({ranks} ranks, {'NCCL on GPU' if device == 'cuda' else 'Gloo on CPU'})"
    horovodrun = host.which("horovodrun")
    if not horovodrun:
        return CheckResult(name, False, "horovodrun is not installed (not on PATH)"), ""
    cmd = [horovodrun, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}",
           host.python, str(ENTRYPOINT_SCRIPT), "allreduce-worker", "--device", device]
    res = host.run(cmd, settings.timeout_s, NCCL_DEBUG_ENV if device == "cuda" else None)
    done = parse_allreduce_ranks(res.out)
    if res.rc == 0 and done == set(range(ranks)):
        return CheckResult(name, True, f"all {ranks} ranks got the expected sum"), res.out
    detail = f"exit {res.rc}, ranks ok: {sorted(done)}; output: {res.out.strip()[-500:]}"
    return CheckResult(name, False, detail), res.out



def run_selftest(host: Host, settings: Settings, emit: Callable[[str], None] = print) -> bool:
    results = []

    def record(r: CheckResult) -> CheckResult:
        emit(r.line())
        results.append(r)
        return r

    build = record(check_horovod_build(host, settings))
    gpu_count, source = visible_gpus(host, settings.timeout_s) if settings.expect_gpus != 0 else (0, "")
    record(check_gpus(gpu_count, source, settings.expect_gpus))
    record(check_efa(host, settings))
    efa = efa_expected(settings)
    device, ranks = plan_allreduce(gpu_count, efa)
    output = ""
    if build.ok:
        allreduce, output = check_allreduce(host, settings, device, ranks)
        record(allreduce)
    else:
        record(CheckResult("allreduce", False, "not run: Horovod's build check failed"))
    if efa:
        record(check_nccl_uses_efa(output, device) if build.ok
               else CheckResult("nccl over efa", False, "not run: Horovod's build check failed"))
    ok = all(r.ok for r in results)
    emit(f"selftest: {'passed' if ok else 'FAILED'} ({sum(r.ok for r in results)}/{len(results)} ok)")
    return ok



def allreduce_worker(device: str) -> int:
    """One rank of the self-test's allreduce: rank r contributes r+1; every rank must see the sum."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    t = torch.full((1024,), float(hvd.rank() + 1), device=device)
    total = hvd.allreduce(t, op=hvd.Sum)
    expected = hvd.size() * (hvd.size() + 1) / 2
    if torch.allclose(total.cpu(), torch.full((1024,), expected)):
        print(f"{ALLREDUCE_OK} rank={hvd.rank()} size={hvd.size()} device={device}", flush=True)
        return EXIT_OK
    print(f"allreduce mismatch on rank {hvd.rank()}: got {total[0].item()}, expected {expected}", flush=True)
    return EXIT_SELFTEST_FAILED
