"""The offline harness itself: an unanswered invoke fails loudly; config reaches the program as the
engine passes it (strings, JSON for structured values)."""

import pytest

from tests.infra.harness import engine_config, run_program


def test_unmocked_invoke_fails_naming_its_token():
    with pytest.raises(Exception, match=r"no mock answer for invoke 'aws:index/getCallerIdentity"):
        run_program("dev", invokes={"aws:index/getCallerIdentity:getCallerIdentity": None})


def test_engine_config_is_strings_and_json():
    cfg = engine_config({"aws:region": "us-east-1", "ringtrain:ttlHours": 72, "ringtrain:compute": False,
                         "ringtrain:network": {"cidr": "10.0.0.0/16"}})
    assert cfg == {"aws:region": "us-east-1", "ringtrain:ttlHours": "72", "ringtrain:compute": "false",
                   "ringtrain:network": '{"cidr": "10.0.0.0/16"}'}
