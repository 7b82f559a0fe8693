import pytest


def _comparison():
    return {
        "metric": "samples_per_sec", "baseline": "ddp", "repeats": 2, "order": ["ddp", "hvd", "hvd", "ddp"],
        "contenders": {
            "ddp": {"config": {}, "samples": [100.0, 90.0], "median": 95.0, "runs": [{}, {}]},
            "hvd": {"config": {"threads": 1}, "samples": [110.0, 99.0], "median": 104.5, "runs": [{}, {}]},
        },
        "ratios": {"hvd": {"per_repeat": [1.1, 1.1], "median": 1.1}},
    }


@pytest.fixture
def results():
    """A complete, valid results document (the shape `python -m bench` writes)."""
    return {
        "schema_version": 1, "name": "latest", "command": "scripts/bench", "quick": False,
        "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:10:00+00:00",
        "machine": {"cores": 2, "cpu_model": "Test CPU", "load_avg": [1.0, 1.0, 1.0]},
        "versions": {"python": "3.11.7", "torch": "2.13.0", "horovod": "0.28.1"},
        "sections": {
            "peer_study": {"status": "ok", "comparison": _comparison(), "best": "hvd",
                           "best_ratio_to_ddp": 1.1, "reaches_ddp": {"hvd": True}},
            "recovery": {"status": "failed", "reason": "the local cluster did not come up"},
        },
    }
