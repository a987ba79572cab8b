"""``workshop routing``: argument checks that fail before anything starts."""

from __future__ import annotations

import pytest

from helpers.cli import main as cli


def test_unknown_policy_is_refused_before_any_engine_starts(capsys):
    assert cli.main(["routing", "--policies", "round_robin,fastest"]) == 2
    assert "fastest" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--replicas=1", "--turns=0", "--concurrency=0"])
def test_sizes_out_of_range_are_usage_errors(flag):
    with pytest.raises(SystemExit):
        cli.main(["routing", flag])
