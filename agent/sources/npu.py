"""``npu``: the Ascend card this rank runs on, read with ``npu-smi`` on the sampler thread.

Which card: the launcher's ``DEVICE_ID`` (msrun), else the local rank (``LOCAL_RANK``), else 0;
an index into ``ASCEND_RT_VISIBLE_DEVICES`` when that lists the visible logic ids. ``npu-smi
info -m`` (once) maps the logic id to its NPU ID and Chip ID; each sample then runs
``npu-smi info`` ``-t usages -i N`` and ``-t ecc -i N`` (per-card output, split at its ``Chip
ID`` lines) and ``-t temp`` / ``-t power`` / ``-t health -i N -c C`` (per chip), each in its own
process with a timeout (``SMI_TIMEOUT_S``), killed with its children when it runs over.

Values: ``aicore_pct``, ``hbm_used_bytes`` / ``hbm_total_bytes`` (from the capacity and usage
rate; on cards without HBM, such as 310P, their DDR, with label ``memory`` = ``DDR``),
``temp_c``, ``power_w``, ``health_ok`` (1 for OK), ``ecc_sbe_total`` / ``ecc_dbe_total`` (the
aggregate single/double-bit counts), and ``aivector_pct`` / ``util_pct`` where the card prints
them. Labels: ``health`` (``OK``, ``Warning``, ``Alarm``, ...), ``health_error`` (its error code
and text, when not NA), ``name`` (the chip name), ``card`` / ``chip`` (NPU ID and Chip ID).

No ``npu-smi``, a hanging one, output nothing here can read, or the id map failing: said once,
and the source stops. One subcommand failing (a card that does not support ``-t ecc``): said
once, and that subcommand is dropped.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .base import NPU_MIN_INTERVAL_S, Reading, SourceError

log = logging.getLogger("rankwatch.agent")

SMI_TIMEOUT_S = 5.0  # one npu-smi call; a card that busy is said and the source stopped
MIB = 1024 * 1024
_KV = re.compile(r"^\s*([^:]+?)\s*:\s*(.*?)\s*$")
_MAP_COLUMNS = ("NPU ID", "Slot ID", "Chip ID", "Chip Logic ID", "Chip Phy-ID", "Chip Name")


@dataclass(frozen=True, slots=True)
class Chip:
    npu_id: int
    chip_id: int
    logic_id: int
    phy_id: int | None
    name: str


# --- which card --------------------------------------------------------------------------


def logic_device(env: Mapping[str, str]) -> int:
    """The logic id of the rank's device, from the launcher's environment."""
    index = next(
        (i for i in map(_int, map(env.get, ("DEVICE_ID", "ASCEND_DEVICE_ID", "LOCAL_RANK")))
         if i is not None),
        0,
    )  # fmt: skip
    visible = [_int(x) for x in env.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if x.strip()]
    ids = [v for v in visible if v is not None]
    if ids and index < len(ids):
        return ids[index]
    return index


def _int(raw: str | None) -> int | None:
    try:
        return None if raw is None else int(raw.strip())
    except ValueError:
        return None


# --- parsing (pure) ----------------------------------------------------------------------


def parse_map(text: str) -> list[Chip]:
    """The compute chips of ``npu-smi info -m`` (MCU rows, whose logic id is ``-``, left out)."""
    lines = [line for line in text.splitlines() if line.strip()]
    head = next((i for i, line in enumerate(lines) if "NPU ID" in line and "Chip" in line), None)
    if head is None:
        return []
    found = sorted((lines[head].find(c), c) for c in _MAP_COLUMNS if c in lines[head])
    columns = [c for _, c in found]
    chips: list[Chip] = []
    for line in lines[head + 1 :]:
        parts = line.split()
        if len(parts) < len(columns) or not parts[0].isdigit():
            continue
        row = dict(zip(columns[:-1], parts[: len(columns) - 1], strict=True))
        name = " ".join(parts[len(columns) - 1 :]) if columns[-1] == "Chip Name" else ""
        logic = row.get("Chip Logic ID", row.get("Chip Phy-ID", ""))
        if not logic.isdigit() or not row.get("Chip ID", "").isdigit():
            continue  # an MCU: not a compute chip
        phy = row.get("Chip Phy-ID", "")
        phy_id = int(phy) if phy.isdigit() else None
        chips.append(Chip(int(row["NPU ID"]), int(row["Chip ID"]), int(logic), phy_id, name))
    return chips


def chip_fields(text: str, chip: int) -> dict[str, str]:
    """``key: value`` lines of one chip in ``npu-smi info -t ...`` output. Per-card output
    closes each chip's lines with ``Chip ID : <n>``; what follows the last one (an MCU's
    sensors) belongs to no chip. Output without ``Chip ID`` lines is all the chip's."""
    blocks: dict[int, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.splitlines():
        found = _KV.match(line)
        if found is None:
            continue
        key, value = found.groups()
        if key == "Chip ID" and value.isdigit():
            blocks[int(value)] = current
            current = {}
        elif key not in current:
            current[key] = value
    if not blocks:
        return current
    return blocks.get(chip, {})


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    found = re.match(r"^-?\d+(?:\.\d+)?", raw.strip())
    return float(found.group()) if found else None


def usage_values(fields: Mapping[str, str]) -> tuple[dict[str, float], dict[str, str]]:
    values: dict[str, float] = {}
    labels: dict[str, str] = {}
    for key, name in (("Aicore Usage Rate(%)", "aicore_pct"),
                      ("Aivector Usage Rate(%)", "aivector_pct"),
                      ("NPU Utilization(%)", "util_pct")):  # fmt: skip
        number = _number(fields.get(key))
        if number is not None:
            values[name] = number
    for kind in ("HBM", "DDR"):  # cards without HBM (310P) report their DDR
        total = _number(fields.get(f"{kind} Capacity(MB)"))
        rate = _number(fields.get(f"{kind} Usage Rate(%)"))
        if total and rate is not None:
            values["hbm_total_bytes"] = total * MIB
            values["hbm_used_bytes"] = round(total * rate / 100) * MIB
            if kind == "DDR":
                labels["memory"] = "DDR"
            break
    return values, labels


def temp_values(fields: Mapping[str, str]) -> dict[str, float]:
    for key, value in fields.items():
        if re.fullmatch(r"(NPU |Chip )?Temperature ?\(C\)", key):
            number = _number(value)
            if number is not None:
                return {"temp_c": number}
    return {}


def power_values(fields: Mapping[str, str]) -> dict[str, float]:
    for key in ("NPU Real-time Power(W)", "Power Dissipation(W)", "Power(W)"):
        number = _number(fields.get(key))
        if number is not None:
            return {"power_w": number}
    return {}


def health_values(fields: Mapping[str, str]) -> tuple[dict[str, float], dict[str, str]]:
    status = fields.get("Health Status", fields.get("Health"))
    if not status:
        return {}, {}
    labels = {"health": status[:64]}
    error = " ".join(
        fields[k] for k in ("Error Code", "Error Information") if fields.get(k, "NA") != "NA"
    )
    if error:
        labels["health_error"] = error[:256]
    return {"health_ok": 1.0 if status == "OK" else 0.0}, labels


def ecc_values(fields: Mapping[str, str]) -> dict[str, float]:
    for kind in ("HBM", "DDR"):
        out: dict[str, float] = {}
        for bits, name in (("Single", "ecc_sbe_total"), ("Double", "ecc_dbe_total")):
            number = _number(fields.get(f"{kind} {bits} Bit Aggregate Total Err Cnt"))
            if number is None:
                number = _number(fields.get(f"{kind} {bits} Bit Error Count"))
            if number is not None:
                out[name] = number
        if out:
            return out
    return {}


Parsed = tuple[dict[str, float], dict[str, str]]
_PARSERS: dict[str, Callable[[Mapping[str, str]], Parsed]] = {
    "usages": usage_values,
    "temp": lambda fields: (temp_values(fields), {}),
    "power": lambda fields: (power_values(fields), {}),
    "health": health_values,
    "ecc": lambda fields: (ecc_values(fields), {}),
}


# --- running npu-smi ---------------------------------------------------------------------


def run_smi(tool: str, args: Sequence[str], timeout_s: float = SMI_TIMEOUT_S) -> str:
    """``npu-smi <args>``'s output; ``SourceError`` when it cannot run, exits non-zero (with
    what it said) or runs past ``timeout_s`` (then it and its children are killed)."""
    command = " ".join(["npu-smi", *args])
    try:
        proc = subprocess.Popen(
            [tool, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            start_new_session=True, text=True, errors="replace",
        )  # fmt: skip
    except OSError as exc:
        raise SourceError(f"telemetry source 'npu': cannot run {command}: {exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.communicate()
        raise SourceError(
            f"telemetry source 'npu': {command} did not answer within {timeout_s:g} s; "
            "NPU values are not sent"
        ) from None
    if proc.returncode != 0:
        said = " ".join((err or out).split())[:200] or "nothing"
        raise SourceError(
            f"telemetry source 'npu': {command} exited with {proc.returncode} ({said})"
        )
    return out


class NpuSource:
    name = "npu"

    def __init__(
        self,
        interval_s: float = NPU_MIN_INTERVAL_S,
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.interval_s = interval_s
        self._env = dict(os.environ if env is None else env)
        self._timeout_s = SMI_TIMEOUT_S if timeout_s is None else timeout_s
        self._tool: str | None = None
        self._chip: Chip | None = None
        self._dropped: set[str] = set()  # subcommands that failed once

    def _start(self) -> tuple[str, Chip]:
        tool = shutil.which("npu-smi", path=self._env.get("PATH"))
        if tool is None:
            raise SourceError(
                "telemetry source 'npu': npu-smi is not on PATH; NPU values are not sent"
            )
        logic = logic_device(self._env)
        text = run_smi(tool, ["info", "-m"], self._timeout_s)
        chips = parse_map(text)
        if not chips:
            raise SourceError(
                "telemetry source 'npu': npu-smi info -m printed no chip this source can read "
                f"({_clip(text)}); NPU values are not sent"
            )
        chip = next((c for c in chips if c.logic_id == logic), None)
        if chip is None:
            known = ", ".join(str(c.logic_id) for c in chips)
            raise SourceError(
                f"telemetry source 'npu': this rank's device (logic id {logic}) is not in "
                f"npu-smi info -m (logic ids {known}); NPU values are not sent"
            )
        self._tool, self._chip = tool, chip
        return tool, chip

    def sample(self, now: float) -> Reading:
        tool, chip = (self._tool, self._chip) if self._chip else self._start()
        assert tool is not None and chip is not None
        card, per_chip = ["-i", str(chip.npu_id)], ["-i", str(chip.npu_id), "-c", str(chip.chip_id)]
        values: dict[str, float] = {}
        labels = {"card": str(chip.npu_id), "chip": str(chip.chip_id)}
        if chip.name:
            labels["name"] = chip.name[:64]
        for kind, args in (("usages", card), ("temp", per_chip), ("power", per_chip),
                           ("health", per_chip), ("ecc", card)):  # fmt: skip
            if kind in self._dropped:
                continue
            try:
                text = run_smi(tool, ["info", "-t", kind, *args], self._timeout_s)
            except SourceError as exc:
                if "did not answer" in str(exc):
                    raise  # a hanging tool: every later call would hang too
                self._dropped.add(kind)
                log.warning("%s; its values are not sent", exc)
                continue
            more, tags = _PARSERS[kind](chip_fields(text, chip.chip_id))
            values.update(more)
            labels.update(tags)
        if not values:
            raise SourceError(
                "telemetry source 'npu': npu-smi printed nothing this source can read for "
                f"NPU {chip.npu_id} chip {chip.chip_id}; NPU values are not sent"
            )
        device = f"npu:{chip.phy_id if chip.phy_id is not None else chip.logic_id}"
        return Reading({k: v for k, v in values.items() if not math.isnan(v)}, labels, device)


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat[:80] + ("..." if len(flat) > 80 else "")) if flat else "nothing"
