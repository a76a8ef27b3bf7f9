"""``gpu``: the NVIDIA GPU this rank runs on, through NVML (``nvidia-ml-py``, imported as
``pynvml``: ``pip install rankwatch[gpu]``), imported and initialised on the first sample.

Which GPU: torch's current device when torch has initialised CUDA, else the local rank
(``LOCAL_RANK``), else 0; an index into ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs)
when that is set, since NVML counts every GPU of the host.

Values: ``util_pct``, ``mem_used_bytes`` / ``mem_total_bytes``, ``temp_c``, ``power_w`` /
``power_limit_w``, ``sm_clock_mhz``, ``throttle_mask`` (the clock event reasons bit mask, its
set bits named in label ``throttle``, e.g. ``"sw_thermal,hw_slowdown"``), ``ecc_corrected_total``
/ ``ecc_uncorrected_total`` (volatile: since the driver loaded), ``retired_rows_total`` (retired
pages, before Ampere), ``remapped_rows_total`` (Ampere and later) and ``pcie_replay_total``. A
field the GPU does not support is left out from then on. No library, no driver, no GPU at that
index: said once, and the source stops.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .base import INTERVAL_S, Reading, SourceError

# NVML's clock event reason bits (nvmlClocksEventReason*), by the names the label uses.
THROTTLE_BITS = (
    (0x1, "idle"), (0x2, "app_clocks"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"), (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)  # fmt: skip


def throttle_label(mask: int) -> str:
    """The set bits of a clock event reasons mask by name (``""`` when none is set)."""
    return ",".join(name for bit, name in THROTTLE_BITS if mask & bit)


def gpu_index(env: Mapping[str, str]) -> int | str:
    """The NVML index (or ``GPU-`` UUID) of this rank's GPU."""
    torch = sys.modules.get("torch")
    index: int | None = None
    try:
        if torch is not None and torch.cuda.is_initialized():
            index = int(torch.cuda.current_device())
    except Exception:  # a torch without CUDA, or one half torn down
        index = None
    if index is None:
        raw = env.get("LOCAL_RANK", "").strip()
        index = int(raw) if raw.isdigit() else 0
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and index < len(visible):
        chosen = visible[index]
        return int(chosen) if chosen.isdigit() else chosen
    return index


def _calls(nvml: Any, handle: Any) -> list[tuple[str, Callable[[], Any]]]:
    """(field, NVML call) for every field, in the order they are read."""
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # before driver 535
    ecc = nvml.nvmlDeviceGetTotalEccErrors
    volatile = nvml.NVML_VOLATILE_ECC
    corrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    sbe = nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    dbe = nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    return [
        ("util", lambda: nvml.nvmlDeviceGetUtilizationRates(handle)),
        ("mem", lambda: nvml.nvmlDeviceGetMemoryInfo(handle)),
        ("temp", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        ("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle)),
        ("limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle)),
        ("clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        ("throttle", lambda: reasons(handle)),
        ("ecc_corrected", lambda: ecc(handle, corrected, volatile)),
        ("ecc_uncorrected", lambda: ecc(handle, uncorrected, volatile)),
        ("retired_sbe", lambda: nvml.nvmlDeviceGetRetiredPages(handle, sbe)),
        ("retired_dbe", lambda: nvml.nvmlDeviceGetRetiredPages(handle, dbe)),
        ("remapped", lambda: nvml.nvmlDeviceGetRemappedRows(handle)),
        ("replay", lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle)),
    ]


def read_fields(nvml: Any, handle: Any, skip: set[str]) -> tuple[dict[str, float], dict[str, str]]:
    """Every field NVML gives for ``handle``; fields whose call is not supported go into
    ``skip`` (and are not asked again); other NVML errors leave the field out of this sample."""
    got: dict[str, Any] = {}
    not_supported = getattr(nvml, "NVMLError_NotSupported", nvml.NVMLError)
    for name, call in _calls(nvml, handle):
        if name in skip:
            continue
        try:
            got[name] = call()
        except not_supported:
            skip.add(name)
        except nvml.NVMLError:
            pass
    values: dict[str, float] = {}
    labels: dict[str, str] = {}
    if "util" in got:
        values["util_pct"] = float(got["util"].gpu)
    if "mem" in got:
        values["mem_used_bytes"] = float(got["mem"].used)
        values["mem_total_bytes"] = float(got["mem"].total)
    for name, key, scale in (("temp", "temp_c", 1.0), ("power", "power_w", 1e-3),
                             ("limit", "power_limit_w", 1e-3), ("clock", "sm_clock_mhz", 1.0),
                             ("ecc_corrected", "ecc_corrected_total", 1.0),
                             ("ecc_uncorrected", "ecc_uncorrected_total", 1.0),
                             ("replay", "pcie_replay_total", 1.0)):  # fmt: skip
        if name in got:
            values[key] = float(got[name]) * scale  # NVML reports milliwatts
    if "throttle" in got:
        values["throttle_mask"] = float(got["throttle"])
        labels["throttle"] = throttle_label(int(got["throttle"]))
    if "retired_sbe" in got or "retired_dbe" in got:
        values["retired_rows_total"] = float(
            len(got.get("retired_sbe", ())) + len(got.get("retired_dbe", ()))
        )
    if "remapped" in got:  # (corrected rows, uncorrected rows, pending, failure)
        values["remapped_rows_total"] = float(got["remapped"][0] + got["remapped"][1])
    return values, labels


class GpuSource:
    name = "gpu"

    def __init__(self, interval_s: float = INTERVAL_S, *, env: Mapping[str, str] | None = None):
        self.interval_s = interval_s
        self._env = dict(os.environ if env is None else env)
        self._nvml: Any = None
        self._handle: Any = None
        self._device = ""
        self._skip: set[str] = set()

    def _start(self) -> Any:
        try:
            import pynvml as nvml
        except ImportError:
            raise SourceError(
                "telemetry source 'gpu' needs nvidia-ml-py, which is not installed "
                "(pip install rankwatch[gpu]); GPU values are not sent"
            ) from None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise SourceError(
                f"telemetry source 'gpu': NVML did not start ({_nvml_words(nvml, exc)}); "
                "GPU values are not sent"
            ) from None
        index = gpu_index(self._env)
        try:
            if isinstance(index, str):
                self._handle = nvml.nvmlDeviceGetHandleByUUID(index)
            else:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            raise SourceError(
                f"telemetry source 'gpu': no GPU {index} ({_nvml_words(nvml, exc)}); "
                "GPU values are not sent"
            ) from None
        self._device = f"gpu:{index}"
        self._nvml = nvml
        return nvml

    def sample(self, now: float) -> Reading:
        nvml = self._nvml or self._start()
        values, labels = read_fields(nvml, self._handle, self._skip)
        if not values:
            raise SourceError(f"telemetry source 'gpu': NVML gave no value for {self._device}")
        return Reading(values, labels, self._device)


def _nvml_words(nvml: Any, exc: Exception) -> str:
    """NVML's error in words, naming the two usual causes on a machine without a GPU."""
    if isinstance(exc, getattr(nvml, "NVMLError_LibraryNotFound", ())):
        return "libnvidia-ml not found: no NVIDIA driver installed"
    if isinstance(exc, getattr(nvml, "NVMLError_DriverNotLoaded", ())):
        return "the NVIDIA driver is not loaded"
    return str(exc) or type(exc).__name__
