"""The restart policy and a failure's cost (cluster/recovery.py)."""

import pytest

from cluster.recovery import Next, decide, failure_cost
from train.contract import EXIT_BAD_INPUT, EXIT_HUNG, EXIT_INTERRUPTED_RESUMABLE, EXIT_PREFLIGHT_FAILED


@pytest.mark.parametrize("code", [1, 137, EXIT_HUNG, None, 255])
def test_any_failure_but_bad_input_restarts_while_restarts_are_left(code):
    assert decide(code, completed=False, resubmits_left=3, restarts_left=1).next is Next.RESTART
    last = decide(code, completed=False, resubmits_left=3, restarts_left=0)
    assert last.next is Next.FAIL and "--max-restarts" in last.reason


@pytest.mark.parametrize("code", [EXIT_BAD_INPUT, EXIT_PREFLIGHT_FAILED])
def test_bad_input_and_a_failed_preflight_are_never_retried(code):
    assert decide(code, completed=False, resubmits_left=3, restarts_left=3).next is Next.FAIL


def test_a_spot_stop_uses_the_resubmits_not_the_restarts():
    assert decide(EXIT_INTERRUPTED_RESUMABLE, completed=False, resubmits_left=1,
                  restarts_left=0).next is Next.RESUBMIT
    assert decide(EXIT_INTERRUPTED_RESUMABLE, completed=False, resubmits_left=0,
                  restarts_left=5).next is Next.FAIL


@pytest.mark.parametrize("code", [1, EXIT_INTERRUPTED_RESUMABLE, EXIT_HUNG, None])
def test_a_job_whose_final_checkpoint_is_written_is_done_whatever_its_exit(code):
    d = decide(code, completed=True, resubmits_left=0, restarts_left=0)
    assert d.next is Next.DONE and "final checkpoint" in d.reason


def test_the_cost_counts_steps_since_the_checkpoint_and_the_time_to_get_back_there():
    failed = [{"step": s, "loss": 1.0, "time": 100.0 + s} for s in range(10, 71, 10)]
    nxt = [{"step": s, "loss": 1.0, "time": 200.0 + s} for s in range(60, 91, 10)]
    cost = failure_cost(failed, failed_ended_at=175.0, resumed_from=50, next_attempt=nxt)
    assert (cost.reached_step, cost.steps_lost) == (70, 20)
    assert cost.seconds_lost == pytest.approx(260.0 - 150.0)   # at step 50 -> first record past 50 again
    assert "20 step(s) redone from step 50" in cost.describe()


def test_the_cost_of_a_failure_before_any_checkpoint_counts_from_scratch():
    failed = [{"step": 5, "loss": 1.0, "time": 10.0}, {"step": 10, "loss": 1.0, "time": 12.0}]
    cost = failure_cost(failed, failed_ended_at=20.0, resumed_from=None, next_attempt=[])
    assert cost.steps_lost == 10 and cost.seconds_lost == pytest.approx(10.0)
    assert "from scratch" in cost.describe()


def test_a_slow_link_caps_both_directions_of_the_hosts_veth():
    from cluster.local.network import plan_network, rate_limit_commands

    plan = plan_network(7, 2, isolated=True)
    host = plan.hosts[1]
    out, inner = rate_limit_commands(plan, host, "10mbit")
    assert out[:5] == ["tc", "qdisc", "replace", "dev", host.veth_outer] and "10mbit" in out
    assert inner[:4] == ["ip", "netns", "exec", host.netns] and plan.pod_iface in inner and "10mbit" in inner
    with pytest.raises(ValueError, match="network-namespace hosts"):
        rate_limit_commands(plan_network(7, 2, isolated=False), plan_network(7, 2, isolated=False).hosts[0],
                            "10mbit")
