"""The offline harness itself: an unanswered invoke fails loudly; config reaches the program as the
engine passes it (strings, JSON for structured values)."""

import asyncio
import gc

import pytest

from tests.infra.harness import engine_config, run_program


def test_unmocked_invoke_fails_naming_its_token():
    with pytest.raises(Exception, match=r"no mock answer for invoke 'aws:index/getCallerIdentity"):
        run_program("dev", invokes={"aws:index/getCallerIdentity:getCallerIdentity": None})


def test_a_failed_run_leaves_no_error_for_asyncio_to_log_later():
    """The failed run's outputs go on failing in the next run's event loop; each would log its copy of
    the error when collected ("Future exception was never retrieved", ~240 tracebacks at the end of
    the suite's output) unless the harness marks them seen."""
    with pytest.raises(Exception, match="no mock answer for invoke"):
        run_program("dev", invokes={"aws:index/getCallerIdentity:getCallerIdentity": None})
    run_program("dev")
    gc.collect()
    # _log_traceback: asyncio's flag for an error nobody has retrieved (what it logs at collection)
    unseen = [f for f in gc.get_objects() if isinstance(f, asyncio.Future) and f.done() and f._log_traceback]
    assert not unseen, f"{len(unseen)} futures would log their error"


def test_engine_config_is_strings_and_json():
    cfg = engine_config({"aws:region": "us-east-1", "ringtrain:ttlHours": 72, "ringtrain:compute": False,
                         "ringtrain:network": {"cidr": "10.0.0.0/16"}})
    assert cfg == {"aws:region": "us-east-1", "ringtrain:ttlHours": "72", "ringtrain:compute": "false",
                   "ringtrain:network": '{"cidr": "10.0.0.0/16"}'}
