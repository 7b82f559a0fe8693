"""--metrics-lines: the metrics records as tagged lines in the launcher's log, the AWS backend's only
channel back from the cluster (train/metrics.py)."""

from __future__ import annotations


def test_metrics_lines_round_trip_through_a_launchers_log(capsys):
    from train.metrics import MetricsLog, metrics_from_log

    log = MetricsLog(None, None, False, 10, 0, lines=True)
    records = [{"step": 5, "loss": 1.5, "checkpoints": [5]}, {"step": 5, "eval_top1": 0.5}]
    for record in records:
        log.log(record)
    log.close()
    printed = capsys.readouterr().out.splitlines()
    lines = ["[0]<stderr>:noise", *(f"[0]<stdout>:{line}" for line in printed),
             '[0]<stdout>:RINGTRAIN_METRICS {"step": 6, "lo', "RINGTRAIN_METRICS [1, 2]"]
    assert metrics_from_log(lines) == records
    quiet = MetricsLog(None, None, False, 10, 0)
    quiet.log(records[0])
    assert capsys.readouterr().out == ""
