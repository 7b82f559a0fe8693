"""The hang watchdog (train/watchdog.py)."""

import threading

import pytest

from train.watchdog import MIN_STEPS, Watchdog, hang_limit_s


def test_the_limit_is_the_floor_until_enough_steps_then_k_times_the_median():
    assert hang_limit_s([0.1] * (MIN_STEPS - 1), factor=10, floor_s=3) == 3
    assert hang_limit_s([0.1] * MIN_STEPS, factor=10, floor_s=0.5) == pytest.approx(1.0)
    assert hang_limit_s([0.1, 0.1, 0.1, 0.1, 9.0], factor=10, floor_s=0.5) == pytest.approx(1.0)
    assert hang_limit_s([0.1] * MIN_STEPS, factor=10, floor_s=5) == 5


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_it_fires_after_the_limit_names_the_collective_and_not_while_paused():
    clock = Clock()
    dog = Watchdog(factor=10, floor_s=2, rank=1, clock=clock)
    for step in range(1, 8):
        clock.t += 0.1
        dog.beat(step)
    with dog.waiting_in("gradient allreduce"):
        clock.t += 1.9
        assert dog.hung() is None            # max(10 x 0.1 s, 2 s) not passed
        clock.t += 0.2
        message = dog.hung()
    assert message is not None
    assert "rank 1 hung" in message and "after step 7" in message
    assert "waiting in gradient allreduce" in message and "exiting 76" in message
    with dog.paused():
        clock.t += 100
        assert dog.hung() is None            # an evaluation or a checkpoint wait is not a hang
    assert dog.hung() is None                # and the clock restarts after it


def test_its_thread_dumps_every_stack_and_calls_the_exit(tmp_path):
    fired = threading.Event()
    with open(tmp_path / "stderr", "w+") as f:   # faulthandler writes to a real file descriptor
        dog = Watchdog(factor=10, floor_s=0.2, rank=0, stream=f, on_hang=fired.set)
        dog.start()
        with dog.waiting_in("broadcast of the state"):
            assert fired.wait(5), "the watchdog did not fire"
        dog.stop()
        f.seek(0)
        text = f.read()
    assert "most recent call first" in text               # faulthandler's stack dump
    assert "waiting in broadcast of the state" in text
