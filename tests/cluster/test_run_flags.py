"""`ringtrain run`'s flags say what is wrong with them, each in its own name, and what they mean."""

from __future__ import annotations

import pytest

from cluster import cli


@pytest.mark.parametrize("hosts", ["-1", "0", "33"])
def test_a_bad_host_count_names_hosts_and_no_other_flag(capsys, hosts):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--hosts", hosts])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2
    assert err == f"run: error: --hosts {hosts}: must be between 1 and 32"


def test_a_bad_job_name_is_still_named(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--job-name", "Bad_Name"])
    assert exit_.value.code == 2
    assert "run: error: --job-name: " in capsys.readouterr().err


def test_the_help_says_what_checkpoint_every_0_does(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("0: no periodic checkpoints, only the one at the end and the one a stop (SIGTERM, a reclaim) "
            "writes, so a job that crashes starts over from step 0") in help_text
