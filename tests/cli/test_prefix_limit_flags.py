"""`--max-private-continuations`, `--max-shared-prefixes`, `--max-long-anchors-per-continuation`:
validated in one line, and what they become in the prefix tree (`kv.snapshot_policy`)."""
from __future__ import annotations

import pytest

from ninfer_engine.cli.capabilities import Machine, check_features
from ninfer_engine.cli.flag_values import UsageError
from ninfer_engine.cli.flags import parse_args
from ninfer_engine.kv.snapshot_policy import SnapshotLimits
from ninfer_engine.memory_plan import snapshot_limits

from tests.cli.test_verify_on_load import converted, refused  # noqa: F401

FLAGS = ("--max-private-continuations", "--max-shared-prefixes",
         "--max-long-anchors-per-continuation")


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("raw, reason", [("-1", "is out of range 0..inf"),
                                         ("two", "expected an integer, got 'two'")])
def test_bad_values_give_one_line_reasons(flag, raw, reason):
    with pytest.raises(UsageError) as err:
        parse_args(["m", flag, raw], {})
    assert str(err.value).startswith(f"{flag}: ") and reason in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("flag", FLAGS)
def test_they_conflict_with_no_prefix_reuse(flag):
    with pytest.raises(UsageError, match=f"^--no-prefix-reuse conflicts with {flag}$"):
        parse_args(["m", "--no-prefix-reuse", flag, "3"], {})


def test_they_reach_the_tree_and_are_no_longer_refused():
    parsed = parse_args(["m", "--max-private-continuations", "5", "--max-shared-prefixes", "0",
                         "--max-long-anchors-per-continuation", "7"], {})
    check_features(parsed.config, parsed.explicit, Machine(cuda_devices=0))  # no refusal
    assert snapshot_limits(parsed.config) == SnapshotLimits(5, 0, 7)
    # unset: the device slots alone bound private and shared snapshots; 2 long anchors
    assert snapshot_limits(parse_args(["m"], {}).config) == SnapshotLimits(None, None, 2)


def test_a_bad_value_refuses_to_start_in_one_line(converted):  # noqa: F811
    code, _, err = refused(converted, "--max-long-anchors-per-continuation", "-2")
    assert code == 1 and "Traceback" not in err
    assert err.splitlines()[0] == ("ninfer-serve: error: --max-long-anchors-per-continuation: "
                                   "-2 is out of range 0..inf")
