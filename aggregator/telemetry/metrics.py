"""The telemetry metrics rankwatch knows by name: unit, which way from the peers is a fault and
which alert rule says so, the effect a card must show beyond the robust z, the Prometheus names
DCGM exporter and npu-exporter users already chart, and the rank table's columns. The one
table: the outlier rules (``outliers``), ``/metrics`` (``dashboard/prom.py``), the page's
hardware charts and `rankwatch status` read it. Names follow the wire: ``<source>/<key>``.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = float(2**20)

# Alert rules of the hardware family and their default severities (alerts/config.py).
RULES = {
    "hw_hot": "warning",  # hotter than its peers
    "hw_clock": "warning",  # slower-clocked than its peers
    "hw_load": "warning",  # more loaded (utilisation, memory, host CPU) than its peers
    "hw_ecc": "critical",  # uncorrectable ECC errors went up
    "hw_health": "critical",  # the driver says the card is not OK
    "hw_throttle": "warning",  # clock slowdown reasons set (thermal, power brake, ...)
    "hw_node": "warning",  # the cards of one host are outliers together: one node fault
}


@dataclass(frozen=True)
class TelemetryMetric:
    name: str
    unit: str
    title: str  # for people: chart titles, status lines
    direction: str = "off"  # high | low | off: which way from the peers is a fault
    rule: str | None = None  # the alert rule an outlier raises
    gap: float = 0.0  # ... only this far from the median in the metric's unit (high) ...
    ratio: float = 1.0  # ... and beyond this ratio of it (low: below it, high: above it)
    abs_floor: float = 1e-9  # robust scale floor, in the metric's unit
    rel_floor: float = 0.01  # ... and relative to the median
    dcgm: str = ""  # DCGM exporter's name for the same value
    npu: str = ""  # npu-exporter's
    prom_scale: float = 1.0  # our unit -> theirs (bytes -> MiB)
    column: str = ""  # the rank table's column: temp | util | mem
    chart: bool = True  # drawn in the page's hardware section
    peers: bool = False  # its peers' median is kept (context for other findings), never flagged


KNOWN: tuple[TelemetryMetric, ...] = (
    TelemetryMetric("gpu/temp_c", "°C", "GPU temperature", "high", "hw_hot", gap=8.0,
                    abs_floor=1.0, dcgm="DCGM_FI_DEV_GPU_TEMP", column="temp"),
    TelemetryMetric("npu/temp_c", "°C", "NPU temperature", "high", "hw_hot", gap=8.0,
                    abs_floor=1.0, npu="npu_chip_info_temperature", column="temp"),
    TelemetryMetric("gpu/sm_clock_mhz", "MHz", "SM clock", "low", "hw_clock", ratio=0.85,
                    abs_floor=15.0, dcgm="DCGM_FI_DEV_SM_CLOCK"),
    TelemetryMetric("gpu/util_pct", "%", "GPU utilisation", "high", "hw_load", gap=20.0,
                    abs_floor=2.0, dcgm="DCGM_FI_DEV_GPU_UTIL", column="util"),
    TelemetryMetric("npu/aicore_pct", "%", "AI Core utilisation", "high", "hw_load", gap=20.0,
                    abs_floor=2.0, npu="npu_chip_info_utilization", column="util"),
    TelemetryMetric("gpu/mem_used_bytes", "B", "GPU memory used", "high", "hw_load",
                    gap=1024 * MIB, ratio=1.2, abs_floor=256 * MIB, dcgm="DCGM_FI_DEV_FB_USED",
                    prom_scale=1 / MIB, column="mem"),
    TelemetryMetric("npu/hbm_used_bytes", "B", "HBM used", "high", "hw_load", gap=1024 * MIB,
                    ratio=1.2, abs_floor=256 * MIB, npu="npu_chip_info_hbm_used_memory",
                    prom_scale=1 / MIB, column="mem"),
    TelemetryMetric("gpu/power_w", "W", "GPU power", dcgm="DCGM_FI_DEV_POWER_USAGE", peers=True),
    TelemetryMetric("npu/power_w", "W", "NPU power", npu="npu_chip_info_power", peers=True),
    TelemetryMetric("gpu/power_limit_w", "W", "GPU power limit", chart=False,
                    dcgm="DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    TelemetryMetric("gpu/mem_total_bytes", "B", "GPU memory total", chart=False,
                    dcgm="DCGM_FI_DEV_FB_TOTAL", prom_scale=1 / MIB),
    TelemetryMetric("npu/hbm_total_bytes", "B", "HBM total", chart=False,
                    npu="npu_chip_info_hbm_total_memory", prom_scale=1 / MIB),
    TelemetryMetric("gpu/throttle_mask", "", "clock slowdown reasons", chart=False,
                    dcgm="DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    TelemetryMetric("gpu/ecc_corrected_total", "", "ECC corrected", chart=False,
                    dcgm="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    TelemetryMetric("gpu/ecc_uncorrected_total", "", "ECC uncorrected",
                    dcgm="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    TelemetryMetric("gpu/retired_rows_total", "", "retired pages", chart=False,
                    dcgm="DCGM_FI_DEV_RETIRED_DBE"),
    TelemetryMetric("gpu/remapped_rows_total", "", "remapped rows", chart=False,
                    dcgm="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    TelemetryMetric("gpu/pcie_replay_total", "", "PCIe replays", chart=False,
                    dcgm="DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    TelemetryMetric("npu/health_ok", "", "NPU health OK", chart=False,
                    npu="npu_chip_info_health_status"),
    TelemetryMetric("npu/ecc_sbe_total", "", "HBM ECC single-bit", chart=False,
                    npu="npu_chip_info_hbm_ecc_single_bit_error_cnt"),
    TelemetryMetric("npu/ecc_dbe_total", "", "HBM ECC double-bit",
                    npu="npu_chip_info_hbm_ecc_double_bit_error_cnt"),
    TelemetryMetric("host/cpu_pct", "%", "host CPU", "high", "hw_load", gap=30.0,
                    abs_floor=3.0),
    TelemetryMetric("host/proc_cpu_pct", "%", "rank process CPU"),
    TelemetryMetric("host/rss_bytes", "B", "rank process RSS"),
    TelemetryMetric("host/mem_available_bytes", "B", "host memory available"),
    TelemetryMetric("host/load1", "", "host load (1 min)"),
    TelemetryMetric("host/disk_free_log_bytes", "B", "disk free (logs)", chart=False),
    TelemetryMetric("host/disk_free_ckpt_bytes", "B", "disk free (checkpoints)", chart=False),
    TelemetryMetric("host/net_rx_bytes_per_s", "B/s", "network in"),
    TelemetryMetric("host/net_tx_bytes_per_s", "B/s", "network out"),
    TelemetryMetric("memory/allocated_bytes", "B", "framework memory allocated"),
    TelemetryMetric("memory/max_allocated_bytes", "B", "framework memory peak", chart=False),
    TelemetryMetric("memory/reserved_bytes", "B", "framework memory reserved", chart=False),
)  # fmt: skip

BY_NAME: dict[str, TelemetryMetric] = {m.name: m for m in KNOWN}
ORDER: dict[str, int] = {m.name: i for i, m in enumerate(KNOWN)}
SCORED: tuple[TelemetryMetric, ...] = tuple(m for m in KNOWN if m.rule is not None)
# Counters whose any increase is a fault (hw_ecc)
ECC_COUNTERS = ("gpu/ecc_uncorrected_total", "npu/ecc_dbe_total")
HEALTH_OK = "npu/health_ok"
HEALTH_LABEL = "npu/health"
THROTTLE_MASK = "gpu/throttle_mask"
THROTTLE_LABEL = "gpu/throttle"
CLOCK = "gpu/sm_clock_mhz"
POWER = "gpu/power_w"

# NVML clock event reasons (nvmlClocksEventReason*): the ones that slow a card down. Idle,
# application clocks, sync boost and display clock settings are not faults.
THROTTLE_BITS: dict[int, str] = {
    0x4: "power_cap",
    0x8: "hw_slowdown",
    0x40: "sw_thermal",
    0x80: "hw_thermal",
    0x100: "power_brake",
}
# Bits that only count when most peers do not share them: a whole job at its power cap is
# how a busy GPU runs, one card at it while the others are not is a fault.
SHARED_OK_BITS = 0x4


def info(name: str) -> TelemetryMetric:
    """The known metric, or a generic entry (its unit guessed from the name's suffix)."""
    known = BY_NAME.get(name)
    if known is not None:
        return known
    unit = next((u for suffix, u in _SUFFIX_UNITS if name.endswith(suffix)), "")
    return TelemetryMetric(name, unit, name)


_SUFFIX_UNITS = (("_bytes_per_s", "B/s"), ("_bytes", "B"), ("_pct", "%"), ("_c", "°C"),
                 ("_w", "W"), ("_mhz", "MHz"), ("_s", "s"))  # fmt: skip


def order_key(name: str) -> tuple[int, str]:
    return (ORDER.get(name, len(ORDER)), name)


def throttle_words(mask: int) -> list[str]:
    """The slowdown reasons set in an NVML clock event mask, in bit order."""
    return [word for bit, word in THROTTLE_BITS.items() if mask & bit]
