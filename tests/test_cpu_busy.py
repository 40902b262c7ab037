"""`gymfleet.serving.cpu_busy`: when the CPU an agent runs on counts as saturated, from the sources a user's machine
has (a cgroup v2 quota, an affinity mask, the whole machine) and from this process's own CPU time."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gymfleet.serving.cpu_busy import (
    BUSY_AT,
    CpuBusy,
    cgroup_quota_cpus,
    cgroup_usage_s,
    machine_meter,
    proc_stat_times,
)


class Meters:
    """Hand-advanced clock, process CPU time and machine (busy, available) CPU seconds."""

    def __init__(self) -> None:
        self.now = self.process = self.busy = self.available = 0.0

    def advance(self, wall: float, *, process: float = 0.0, busy: float = 0.0, cpus: int = 2) -> None:
        self.now += wall
        self.process += process
        self.busy += busy
        self.available += wall * cpus

    def cpu_busy(self) -> CpuBusy:
        return CpuBusy(machine=lambda: (self.busy, self.available), process=lambda: self.process,
                       clock=lambda: self.now)


@pytest.mark.parametrize(("process_share", "machine_share", "cpus", "saturated"), [
    (0.0, 0.0, 2, False),  # idle
    (0.1, 0.1, 2, False),  # a tenth busy: a policy elsewhere does the work
    (0.4, 0.98, 2, True),  # both cores busy 98%: the fleet's own CPU is the bottleneck
    (0.4, BUSY_AT + 0.01, 2, True),  # just over the mark
    (0.4, BUSY_AT - 0.01, 2, False),  # just under
    (0.99, 1 / 64, 64, True),  # one core of 64 busy, and it is this process: its event loop is the bottleneck
    (0.5, 1 / 64, 64, False),  # one core of 64 busy, this process half of it
])
def test_saturated_when_the_cpus_or_this_process_are_busy_enough(process_share, machine_share, cpus, saturated):
    meters = Meters()
    gauge = meters.cpu_busy()
    for _ in range(6):  # steady load, asked every eighth of a second as the ramp does
        meters.advance(0.125, process=0.125 * process_share, busy=0.125 * cpus * machine_share, cpus=cpus)
        assert gauge.saturated() is saturated


@given(st.floats(0.0, 1.0).filter(lambda share: abs(share - BUSY_AT) > 1e-3),
       st.lists(st.floats(0.02, 0.4), min_size=1, max_size=30))
def test_under_a_steady_load_the_answer_is_whether_the_load_reaches_the_mark(share, intervals):
    """However often it is asked (never less often than the window), a steady load reads as what it is."""
    meters = Meters()
    gauge = meters.cpu_busy()
    for wall in intervals:
        meters.advance(wall, busy=2 * wall * share)
        assert gauge.saturated() is (share >= BUSY_AT)


def test_the_last_half_second_counts_not_the_last_call_nor_what_came_before_it():
    meters = Meters()
    gauge = meters.cpu_busy()
    for _ in range(8):
        meters.advance(0.125, busy=0.25)  # both cores busy
        assert gauge.saturated() is True
    meters.advance(0.125, busy=0.25 * 0.6)  # one eighth of a second at 60%: (3 x 1.0 + 0.6) / 4 = 0.9
    assert gauge.saturated() is True
    for _ in range(4):  # then idle: (1 + 1 + 0.6 + 0) / 4 = 0.65, ... 0
        meters.advance(0.125, busy=0.0)
        assert gauge.saturated() is False
    for _ in range(3):
        meters.advance(0.125, busy=0.25)
        gauge.saturated()
    meters.advance(0.125, busy=0.25)
    assert gauge.saturated() is True  # a window of full load again


def test_after_a_pause_longer_than_the_window_it_starts_afresh():
    meters = Meters()
    gauge = meters.cpu_busy()
    meters.advance(0.125, busy=0.25)
    assert gauge.saturated() is True
    meters.advance(30.0, busy=0.0)  # idle between two steps, nobody asking
    assert gauge.saturated() is False  # starts afresh
    meters.advance(0.125, busy=0.25)
    assert gauge.saturated() is True  # the new step's load alone, not diluted by the idle half minute


def test_no_time_gone_by_is_not_saturated():
    meters = Meters()
    gauge = meters.cpu_busy()
    assert gauge.saturated() is False


def test_a_machine_whose_cpu_times_cannot_be_read_counts_only_this_process():
    meters = Meters()
    gauge = CpuBusy(machine=None, process=lambda: meters.process, clock=lambda: meters.now)
    meters.advance(0.125, busy=0.25)
    assert gauge.saturated() is False
    meters.advance(0.5, process=0.5)
    assert gauge.saturated() is True


@pytest.mark.parametrize(("cpu_max", "cpus"), [
    ("200000 100000\n", 2.0),  # docker --cpus 2
    ("50000 100000\n", 0.5),
    ("max 100000\n", None),  # no quota
    ("garbage\n", None),
    ("0 100000\n", None),
    (None, None),  # no cgroup v2 here
])
def test_a_cgroup_v2_quota_is_read_as_cpus(tmp_path, cpu_max, cpus):
    if cpu_max is not None:
        (tmp_path / "cpu.max").write_text(cpu_max)
    assert cgroup_quota_cpus(tmp_path) == cpus


def test_with_a_cgroup_quota_busy_is_the_cgroups_usage_over_the_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one CPU
    stat = tmp_path / "cpu.stat"
    stat.write_text("usage_usec 1000000\nuser_usec 900000\nsystem_usec 100000\n")
    assert cgroup_usage_s(tmp_path) == 1.0
    meter = machine_meter(tmp_path)
    busy_before, available_before = meter()
    time.sleep(0.05)
    stat.write_text("usage_usec 1200000\nuser_usec 1100000\nsystem_usec 100000\n")  # 0.2 s used in ~0.05 s
    busy_after, available_after = meter()
    assert busy_after - busy_before == pytest.approx(0.2)
    assert 0.04 <= available_after - available_before < 1.0  # wall time times one CPU
    gauge = CpuBusy(machine=meter, process=lambda: 0.0)
    stat.write_text("usage_usec 9200000\n")  # far more than the quota allows since: saturated
    assert gauge.saturated() is True


PROC_STAT = """cpu  100 5 50 800 20 3 2 0 40 0
cpu0 60 5 30 380 10 2 1 0 40 0
cpu1 40 0 20 420 10 1 1 0 0 0
intr 12345 0 0
ctxt 999
"""


@pytest.mark.parametrize(("cpus", "busy", "total"), [
    (None, 100 + 5 + 50 + 3 + 2, 980),  # the whole machine; iowait is idle; guest (40) is inside user already
    ([0], 60 + 5 + 30 + 2 + 1, 488),
    ([1], 40 + 20 + 1 + 1, 492),
    ([0, 1], 98 + 62, 980),
])
def test_proc_stat_is_read_as_busy_and_total_ticks(tmp_path, cpus, busy, total):
    stat = tmp_path / "stat"
    stat.write_text(PROC_STAT)
    assert proc_stat_times(cpus, stat) == (busy, total)


@pytest.mark.parametrize("text", ["", "cpu  a b c d\n", "intr 1 2\n"])
def test_an_unreadable_proc_stat_is_none(tmp_path, text):
    stat = tmp_path / "stat"
    stat.write_text(text)
    assert proc_stat_times(None, stat) is None
    assert proc_stat_times(None, tmp_path / "missing") is None


def test_without_a_quota_the_machine_or_the_affinity_mask_is_read(tmp_path):
    meter = machine_meter(tmp_path)  # no cpu.max there: /proc/stat instead
    assert meter is not None
    busy, available = meter()
    assert 0 <= busy <= available and available > 0
    elsewhere = machine_meter(tmp_path, proc_stat=tmp_path / "missing")  # no /proc/stat: psutil's reading
    assert elsewhere is not None
    busy, available = elsewhere()
    assert 0 <= busy <= available and available > 0


def test_this_process_spinning_counts_as_saturated():
    """For real: a process that keeps a core busy is saturated whatever the rest of the machine does (were the
    machine so loaded that this process got less than nine tenths of a core, its CPUs are saturated instead)."""
    gauge = CpuBusy.here()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass
    assert gauge.saturated() is True
