"""The GPU use readers on recorded real outputs (tests/unit/data/gpu/SOURCE.md says where each
comes from), the sampler's failure rules, and the aggregate maths (hypothesis for the invariants).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.domain.utilisation import (
    HISTOGRAM_BUCKETS,
    GpuUse,
    add_reading,
    empty_histogram,
    histogram_median,
    low_utilisation,
    mean_percent,
    node_reading,
)
from orchestrator.fabric.gpu_sampler import (
    GuardedSampler,
    NvmlSampler,
    SamplerError,
    choose_sampler,
    parse_query_gpu,
    reading_from_nvml,
)
from orchestrator.sources.slurm_usage import parse_elapsed, parse_sacct_usage

DATA = Path(__file__).parent / "data" / "gpu"
RTX2080_FIELDS = (
    "power.limit,power.min_limit,power.max_limit,memory.total,vbios_version,driver_version,name,"
    "gpu_uuid,power.draw,temperature.gpu,temperature.memory,clocks.current.graphics,clocks.sm,"
    "clocks.mem,utilization.gpu,utilization.memory,fan.speed,pcie.link.width.current,pstate"
).split(",")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_nvidia_smi_rows_of_a_real_rtx_2080_are_read_by_field_name() -> None:
    [gpu] = parse_query_gpu((DATA / "nvidia-smi-rtx2080.csv").read_text(), RTX2080_FIELDS)
    assert gpu.index == 0  # no index field: the row's position
    assert gpu.uuid == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"
    assert gpu.utilisation_percent == 86.0
    assert gpu.memory_total_mib == 7979.0
    assert gpu.memory_used_mib is None  # not asked for: unknown, not 0


def test_nvidia_smi_not_available_values_are_unknown_never_zero() -> None:
    fields = ["memory.used", "memory.total", "utilization.memory"]
    [gpu] = parse_query_gpu((DATA / "nvidia-smi-gb10.csv").read_text(), fields)
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (None, None)
    assert gpu.utilisation_percent is None


def test_nvidia_smi_with_header_and_units_takes_the_header_order() -> None:
    text = ("memory.total [MiB], utilization.gpu [%], index, memory.used [MiB]\n"
            + "7979 MiB, 86 %, 0, [Not Supported]\n")
    [gpu] = parse_query_gpu(text)
    assert (gpu.index, gpu.utilisation_percent, gpu.memory_total_mib, gpu.memory_used_mib) == (
        0, 86.0, 7979.0, None)


def test_nvml_values_of_real_gpus_become_readings_in_mib() -> None:
    devices = json.loads((DATA / "nvml-titan-z-k40c.json").read_text())["devices"]
    readings = [reading_from_nvml(d["index"], b"GPU-x", d["gpu_utilization_percent"],
                                  d["used_memory_mb"] * 2**20, d["total_memory_mb"] * 2**20)
                for d in devices]
    assert [(r.utilisation_percent, r.memory_used_mib, r.memory_total_mib) for r in readings] == [
        (9.0, 771.0, 6134.0), (0.0, 15.0, 6143.0)]  # a measured 0 % stays 0
    assert readings[0].uuid == "GPU-x"
    assert reading_from_nvml(0, None, None, None, None).utilisation_percent is None


def test_without_an_nvidia_driver_nvml_is_refused_and_nothing_is_measured() -> None:
    # The real nvidia-ml-py package on a machine with no NVIDIA driver (this one).
    with pytest.raises(SamplerError, match="NVML"):
        NvmlSampler()
    sampler, why = choose_sampler("nvml")
    assert sampler is None and "NVML" in why
    assert choose_sampler("none")[0] is None


class _Broken:
    source = "nvidia-smi"

    def __init__(self) -> None:
        self.calls = 0

    def read(self):
        self.calls += 1
        raise SamplerError("nvidia-smi: timed out")


def test_a_failing_sampler_is_logged_once_and_leaves_the_readings_unknown(caplog) -> None:
    broken = _Broken()
    guarded = GuardedSampler(broken)
    with caplog.at_level(logging.WARNING, logger="burst.agent"):
        assert [guarded.read() for _ in range(5)] == [None] * 5
    assert broken.calls == 5
    assert sum("GPU sampling through nvidia-smi failed" in r.message for r in caplog.records) == 1
    assert GuardedSampler(None, "no nvidia-smi").read() is None


def test_sacct_tres_usage_of_a_real_job_gives_its_gpu_utilisation_and_memory() -> None:
    [job] = parse_sacct_usage((DATA / "sacct-tres-usage-in-ave.txt").read_text()).values()
    assert job.job_id == "18194943"
    assert job.mean_utilisation_percent == 100.0  # the batch step; the extern step is not work
    assert job.peak_memory_mib == round(40777023488 / 2**20, 1)
    assert job.measured


def test_sacct_without_gpu_metrics_is_allocation_only() -> None:
    [job] = parse_sacct_usage((DATA / "sacct-alloc-tres.txt").read_text()).values()
    assert (job.job_id, job.gpus) == ("8117657", 1)
    assert job.mean_utilisation_percent is None and not job.measured
    assert job.peak_memory_mib is None


def test_sacct_steps_are_weighted_by_elapsed_and_bad_values_are_unknown() -> None:
    text = ("JobID|Elapsed|AllocTRES|TRESUsageInAve|TRESUsageInMax\n"
            "7|00:40:00|gres/gpu=2|\n"
            "7.0|00:30:00||gres/gpuutil=80|gres/gpumem=1048576\n"
            "7.1|00:10:00||gres/gpuutil=40|gres/gpumem=3145728\n"
            "8|1-00:00:00|gres/gpu=1|\n"
            "8.batch|1-00:00:00||gres/gpuutil=inf|\n")
    jobs = parse_sacct_usage(text)
    assert jobs["7"].mean_utilisation_percent == 70.0
    assert jobs["7"].peak_memory_mib == 3.0 and jobs["7"].gpus == 2
    assert jobs["8"].mean_utilisation_percent is None and jobs["8"].elapsed_s == 86400
    assert parse_elapsed("01:02:03") == 3723 and parse_elapsed("Unknown") is None


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.01, 60)), min_size=1, max_size=50))
def test_the_histogram_median_is_within_a_bucket_of_the_true_weighted_median(readings) -> None:
    histogram = empty_histogram()
    for percent, seconds in readings:
        add_reading(histogram, percent, seconds)
    ordered = sorted(readings)
    half, seen, true = sum(s for _, s in readings) / 2, 0.0, ordered[-1][0]
    for percent, seconds in ordered:
        seen += seconds
        if seen >= half:
            true = percent
            break
    median = histogram_median(histogram)
    assert median is not None and abs(median - true) <= 100 / HISTOGRAM_BUCKETS + 1e-9


def test_nothing_measured_is_unknown_not_zero() -> None:
    assert histogram_median(empty_histogram()) is None
    assert mean_percent(0.0, 0.0) is None
    assert mean_percent(9.0, 10.0) == 90.0


def test_a_node_is_low_only_while_jobs_hold_gpus_under_the_threshold_and_known() -> None:
    held = [GpuUse(0, 2.0, 100.0, 80000.0, "j-1"), GpuUse(1, 3.0, 100.0, 80000.0, "j-1"),
            GpuUse(2, 90.0, None, None, None)]
    current, since = node_reading(held, 5.0, None, T0)
    assert (current, since) == (2.5, T0)
    later = T0 + timedelta(minutes=31)
    assert node_reading(held, 5.0, since, later) == (2.5, T0)  # keeps the first time
    assert low_utilisation(since, timedelta(minutes=30), later)
    assert not low_utilisation(since, timedelta(minutes=30), T0 + timedelta(minutes=29))
    unknown = [GpuUse(0, None, None, None, "j-1")]
    assert node_reading(unknown, 5.0, since, later) == (None, None)  # unknown is never idle
    idle_node = [GpuUse(0, 0.0, 0.0, 1.0, None)]
    assert node_reading(idle_node, 5.0, since, later) == (0.0, None)  # no job: the idle rule's


def test_the_sacct_call_asks_for_ended_jobs_in_utc_with_the_fields_the_parser_reads() -> None:
    from orchestrator.sources.slurm_usage import SACCT_FIELDS, sacct_command

    since = datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    argv = sacct_command(since, T0 + timedelta(hours=1))
    assert argv[:3] == ["sacct", "--parsable2", "--allusers"]
    assert argv[argv.index("--starttime") + 1] == "2026-01-01T00:00:00"
    assert argv[-1] == "--format=" + ",".join(SACCT_FIELDS)
    assert "TRESUsageInAve" in SACCT_FIELDS and "AllocTRES" in SACCT_FIELDS
