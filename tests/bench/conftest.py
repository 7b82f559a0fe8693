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


def _headline():
    shape = {"steps": 200, "warmup": 20, "batch_size": 32, "workers": 2, "model": "cnn", "width": 64}
    contender = lambda median, config: {"config": config, "samples": [median], "median": median,  # noqa: E731
                                        "runs": [{}]}
    return {
        "status": "ok", "window": "steps 20-220",
        "comparison": {
            "metric": "samples_per_sec", "baseline": "bare-hvd", "repeats": 1,
            "order": ["trainer", "bare-hvd", "ddp", "ddp-pin"],
            "contenders": {
                "trainer": contender(980.0, {"checkpoint_every": 50, "checkpoints_in_window": 4, **shape}),
                "bare-hvd": contender(1000.0, {"threads": 1, "pin": True, "cycle_time_ms": 0.5, "groups": 1,
                                                **shape}),
                "ddp": contender(990.0, shape),
                "ddp-pin": contender(1100.0, {"pin": True, **shape}),
            },
            "ratios": {name: {"per_repeat": [r], "median": r}
                       for name, r in (("trainer", 0.98), ("ddp", 0.99), ("ddp-pin", 1.1))},
        },
        "efficiency": {"trainer_vs_bare_hvd": 0.98, "per_repeat": [0.98], "target": 0.97, "met": True},
        "peer": {"trainer": {"per_repeat": [0.99], "median": 0.99, "target": 1.0, "met": False},
                 "bare-hvd": {"per_repeat": [1.01], "median": 1.01, "target": 1.0, "met": True}},
        "peer_pinned": {"trainer": {"per_repeat": [0.89], "median": 0.89},
                        "bare-hvd": {"per_repeat": [0.91], "median": 0.91}},
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
            "headline": _headline(),
            "recovery": {"status": "failed", "reason": "the local cluster did not come up"},
        },
    }
