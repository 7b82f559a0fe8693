"""The foundation: the Horovod that scripts/setup built runs ring-allreduce over Gloo on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent

WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(1234 + hvd.rank())  # ranks start from DIFFERENT parameters on purpose
    torch.set_num_threads(1)

    # 1. allreduce: each rank contributes rank+1; Sum must be 1+2 on both ranks.
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)

    # 2. one DistributedOptimizer step after broadcasting rank 0's parameters.
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    initial = [p.detach().flatten().tolist() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    x = torch.full((8, 4), float(hvd.rank() + 1))      # different data per rank
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(sys.argv[1] + f".{hvd.rank()}", "w") as f:
        json.dump({"rank": hvd.rank(), "size": hvd.size(), "total": total.item(), "params": params,
                   "initial": initial}, f)
    """
)


def test_check_build_lists_pytorch_and_gloo():
    out = subprocess.run(
        [str(VENV_BIN / "horovodrun"), "--check-build"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "[X] PyTorch" in out
    assert "[X] Gloo" in out


@pytest.mark.slow
def test_two_process_allreduce_and_optimizer_step_agree(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    result_prefix = tmp_path / "result"
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            str(VENV_BIN / "horovodrun"),
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            sys.executable,
            str(script),
            str(result_prefix),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(Path(f"{result_prefix}.{r}").read_text()) for r in (0, 1)]
    assert [r["size"] for r in results] == [2, 2]
    assert [r["total"] for r in results] == [3.0, 3.0]
    # Averaged gradients + identical starting point => bitwise identical parameters after the step.
    assert results[0]["params"] == results[1]["params"]
    # Both started from rank 0's broadcast parameters, and the step really moved them.
    assert results[0]["initial"] == results[1]["initial"]
    assert results[0]["params"] != results[0]["initial"]
