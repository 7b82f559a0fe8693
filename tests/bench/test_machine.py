"""bench.machine.lowest_priority: the local S3 store and the neighbour process run at niceness 19."""

from __future__ import annotations

import subprocess
import sys

import psutil

from bench.machine import lowest_priority


def test_lowest_priority_lowers_every_thread_the_process_already_has():
    # Niceness is per thread on Linux: the local S3 store starts its request threads before the bench
    # lowers it, and those threads did every checkpoint's work at normal priority.
    code = ("import threading, time\n"
            "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        lowest_priority(proc.pid)
        threads = psutil.Process(proc.pid).threads()
        assert len(threads) == 4
        assert [psutil.Process(t.id).nice() for t in threads] == [19] * 4
    finally:
        proc.kill()
        proc.wait()
