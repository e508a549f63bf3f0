"""`--host-kv-mib` / `--host-state-slots` start the prefix cache's host tier; tiers that do not
fit in the RAM available refuse to start in one line with exit 1, unless
`NINFER_HOST_TIER_RAM_GUARD=0` (the real `ninfer-serve --no-tui` on the tiny converted GGUF)."""
from __future__ import annotations

import psutil
import pytest

from ninfer_engine.kv.host_tier import HostTierRamError, check_host_ram

from tests.cli.test_verify_on_load import converted, refused, start_and_stop  # noqa: F401

MIB = 2**20


def test_the_guard_names_the_flags_the_need_and_the_way_out(monkeypatch):
    monkeypatch.delenv("NINFER_HOST_TIER_RAM_GUARD", raising=False)
    too_much = psutil.virtual_memory().available + 2**40
    with pytest.raises(HostTierRamError, match=r"^--host-kv-mib 9 --host-state-slots 2: the "
                       r"host KV/state tiers need \d+\.\d GiB of RAM and \d+\.\d GiB is available "
                       r"\(NINFER_HOST_TIER_RAM_GUARD=0 skips this check\)$"):
        check_host_ram(too_much, "--host-kv-mib 9 --host-state-slots 2")
    check_host_ram(MIB, "--host-kv-mib 1")  # fits: no error
    monkeypatch.setenv("NINFER_HOST_TIER_RAM_GUARD", "0")
    check_host_ram(too_much, "--host-kv-mib 9")  # skipped


def test_a_host_tier_larger_than_ram_refuses_to_start(converted):
    too_many = (psutil.virtual_memory().total + 2**40) // MIB
    code, _, err = refused(converted, "--host-kv-mib", str(too_many))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "NINFER_HOST_TIER_RAM_GUARD=0 skips this check" in lines[0], err
    assert f"--host-kv-mib {too_many}" in lines[0] and "Traceback" not in err


def test_a_host_tier_that_fits_serves(converted):
    code, err = start_and_stop(converted, "--host-kv-mib", "4")
    assert code == 0, err
