"""GPU sampling on a node: each GPU's utilisation and memory, read at every heartbeat.

Readers, first that works wins (``BURST_GPU_SAMPLER`` = ``auto``, ``nvml``, ``nvidia-smi`` or
``none`` forces one):

1. NVML through the ``nvidia-ml-py`` package (``import pynvml``, imported lazily: a bare cloud image
   may not have it): ``nvmlDeviceGetUtilizationRates(...).gpu`` (percent of the last sample period
   a kernel ran), ``nvmlDeviceGetMemoryInfo`` (bytes), ``nvmlDeviceGetUUID``;
2. ``nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total
   --format=csv,noheader,nounits`` (:func:`parse_query_gpu` also reads csv with a header and
   units, and any field order when told the fields);
3. none: no driver, no NVML, no nvidia-smi (the local provider on a machine without GPUs). The
   readings are then absent and the controller records the GPUs' use as **unknown**, never 0.

A value a device does not report (``[N/A]``, ``[Not Supported]``, NVML's NotSupported) is None,
not 0. :class:`GuardedSampler` is what the agent calls: a reader that fails (the driver went
away, nvidia-smi hung) is logged once for the node and its readings are left unknown; the
heartbeat goes on regardless.

Standard library only (besides the optional ``pynvml``): runs on a bare cloud node.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("burst.agent")

SAMPLER_ENV = "BURST_GPU_SAMPLER"
QUERY_FIELDS = ("index", "uuid", "utilization.gpu", "memory.used", "memory.total")
SMI_TIMEOUT_S = 5.0  # a heartbeat must not wait long on a hung driver
MIB = 2**20
_UNKNOWN = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]",
            "[insufficient permissions]", "[gpu is lost]", "[gpu requires reset]"}


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one moment. None: the device (or the reader) did not say."""

    index: int
    uuid: str | None
    utilisation_percent: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None

    def as_json(self, job_id: str | None) -> dict[str, Any]:
        return {"index": self.index, "utilisation_percent": self.utilisation_percent,
                "memory_used_mib": self.memory_used_mib,
                "memory_total_mib": self.memory_total_mib, "job_id": job_id}


class SamplerError(Exception):
    """The reader could not read the GPUs this time."""


class Sampler(Protocol):
    """Reads every GPU of this node; raises :class:`SamplerError` when it cannot."""

    source: str

    def read(self) -> list[GpuReading]: ...


def _number(text: str) -> float | None:
    """A csv value of nvidia-smi: ``95``, ``95 %``, ``745 MiB``; None for N/A and the like."""
    value = text.strip()
    if value.lower() in _UNKNOWN:
        return None
    value = value.split(" ")[0]
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number and number not in (float("inf"), float("-inf")) else None


def parse_query_gpu(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[GpuReading]:
    """Readings from the csv output of ``nvidia-smi --query-gpu=<fields> --format=csv[...]``.

    A header line (``--format=csv`` without ``noheader``) names the columns and wins over
    ``fields``; units (``%``, ``MiB``) and N/A markers are understood. Rows without an index
    take their position as index. Lines that are not rows (blank, warnings) are skipped.
    """
    columns = [f.strip() for f in fields]
    readings: list[GpuReading] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if not line.strip():
            continue
        names = [c.split(" [")[0].strip() for c in cells]
        if "utilization.gpu" in names or "memory.used" in names or "index" in names[:1]:
            columns = names  # a header
            continue
        if len(cells) != len(columns):
            continue
        row = dict(zip(columns, cells, strict=True))
        index = _number(row.get("index", "")) if "index" in row else float(len(readings))
        if index is None or index < 0 or index != int(index):
            continue
        uuid = row.get("uuid") or row.get("gpu_uuid")
        readings.append(GpuReading(
            index=int(index),
            uuid=uuid if uuid and uuid.lower() not in _UNKNOWN else None,
            utilisation_percent=_percent(row.get("utilization.gpu")),
            memory_used_mib=_number(row["memory.used"]) if "memory.used" in row else None,
            memory_total_mib=_number(row["memory.total"]) if "memory.total" in row else None,
        ))
    return readings


def _percent(cell: str | None) -> float | None:
    value = _number(cell) if cell is not None else None
    return None if value is None or not 0 <= value <= 100 else value


class NvidiaSmiSampler:
    """The nvidia-smi reader (the fallback when NVML is not importable)."""

    source = "nvidia-smi"

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def read(self) -> list[GpuReading]:
        try:
            done = subprocess.run(
                [self.binary, f"--query-gpu={','.join(QUERY_FIELDS)}",
                 "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SamplerError(f"nvidia-smi: {exc}") from exc
        if done.returncode != 0:
            raise SamplerError(f"nvidia-smi exited {done.returncode}: "
                               f"{(done.stderr or done.stdout).strip()[:200]}")
        return parse_query_gpu(done.stdout)


def reading_from_nvml(index: int, uuid: str | bytes | None, utilisation_gpu: int | None,
                      memory_used_bytes: int | None,
                      memory_total_bytes: int | None) -> GpuReading:
    """A reading from the values NVML returns (memory in bytes, utilisation in percent)."""
    if isinstance(uuid, bytes):
        uuid = uuid.decode(errors="replace")
    return GpuReading(
        index=index, uuid=uuid or None,
        utilisation_percent=(float(utilisation_gpu) if utilisation_gpu is not None
                             and 0 <= utilisation_gpu <= 100 else None),
        memory_used_mib=None if memory_used_bytes is None else round(memory_used_bytes / MIB, 1),
        memory_total_mib=None if memory_total_bytes is None else round(memory_total_bytes / MIB, 1),
    )


class NvmlSampler:
    """The NVML reader; constructing it initialises NVML (raises SamplerError without it)."""

    source = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml  # noqa: PLC0415 - optional, and absent on a bare image
        except ImportError as exc:
            raise SamplerError("the nvidia-ml-py package (pynvml) is not installed") from exc
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise SamplerError(f"NVML: {exc}") from exc

    def _optional(self, call: Any, *args: Any) -> Any:
        """One NVML query; None when the device does not support it."""
        try:
            return call(*args)
        except self._nvml.NVMLError_NotSupported:
            return None

    def read(self) -> list[GpuReading]:
        nvml = self._nvml
        try:
            readings = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                rates = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
                memory = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle)
                readings.append(reading_from_nvml(
                    index, self._optional(nvml.nvmlDeviceGetUUID, handle),
                    None if rates is None else rates.gpu,
                    None if memory is None else memory.used,
                    None if memory is None else memory.total))
            return readings
        except nvml.NVMLError as exc:
            raise SamplerError(f"NVML: {exc}") from exc


def choose_sampler(probe: str | None = None) -> tuple[Sampler | None, str]:
    """The reader for this node and why: NVML, else nvidia-smi, else None (unknown)."""
    probe = (probe or os.environ.get(SAMPLER_ENV) or "auto").lower()
    if probe == "none":
        return None, f"{SAMPLER_ENV}=none"
    reasons = []
    if probe in ("auto", "nvml"):
        try:
            return NvmlSampler(), "NVML"
        except SamplerError as exc:
            reasons.append(str(exc))
    if probe in ("auto", "nvidia-smi"):
        binary = shutil.which("nvidia-smi")
        if binary is not None:
            return NvidiaSmiSampler(binary), binary
        reasons.append("no nvidia-smi on PATH")
    return None, "; ".join(reasons) or f"unknown {SAMPLER_ENV} value {probe!r}"


class GuardedSampler:
    """What the agent calls every heartbeat: readings, or None (unknown) when there is no
    reader or it failed. A failure is logged once per node, however often it recurs."""

    def __init__(self, sampler: Sampler | None, why: str = "") -> None:
        self.sampler = sampler
        self._warned = False  # the first failure is logged; later ones (flapping) are not
        if sampler is None:
            log.info("no GPU sampler (%s): GPU utilisation of this node is unknown", why)
        else:
            log.info("GPU utilisation sampled through %s", sampler.source)

    @property
    def source(self) -> str | None:
        return self.sampler.source if self.sampler is not None else None

    def read(self) -> list[GpuReading] | None:
        if self.sampler is None:
            return None
        try:
            readings = self.sampler.read()
        except Exception as exc:  # noqa: BLE001 - never let a reader stop the heartbeat
            if not self._warned:
                self._warned = True
                log.warning("GPU sampling through %s failed (%s): utilisation unknown until it "
                            "works again (logged once)", self.sampler.source, exc)
            return None
        return readings


__all__ = [
    "GpuReading", "GuardedSampler", "NvidiaSmiSampler", "NvmlSampler", "QUERY_FIELDS",
    "Sampler", "SamplerError", "choose_sampler", "parse_query_gpu", "reading_from_nvml",
]
