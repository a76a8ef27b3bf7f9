"""Reading telemetry from the store (any thread): series downsampled from the rollups for long
windows, each rank's latest values, label changes, and the export. Store (db.py) mixes it in."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
from rankwatch.aggregator.store.telemetry import LEVELS, TeleRun

Series = dict[int, dict[str, list[float]]]
BAND_KEYS = ("time", "median", "p5", "p95", "min", "max")


class TelemetryReads:
    """Store attributes it reads: ``_state_lock`` and the mirror's ``tele``/``tele_done``."""

    _state_lock: threading.Lock
    _mirror: Any

    def _query(self) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
        raise NotImplementedError  # Reads._query

    def telemetry_runs(self) -> dict[str, dict[str, Any]]:
        """run -> rows, first and last sample time, names, ranks of its stored telemetry."""
        with self._state_lock:
            tele = dict(self._mirror.tele)
        return {run: {"rows": t.rows, "first_time": t.lo, "last_time": t.hi,
                      "names": sorted(t.names), "ranks": len(t.ranks)}
                for run, t in tele.items()}  # fmt: skip

    def telemetry_names(self, run: str) -> list[str]:
        with self._state_lock:
            t = self._mirror.tele.get(run)
        return sorted(t.names) if t is not None else []

    def telemetry_series(
        self,
        run: str,
        name: str,
        ranks: Sequence[int] | None = None,
        start: float | None = None,
        end: float | None = None,
        max_points: int = 1000,
    ) -> Series:
        """rank -> {"time", "value"}: at most ``max_points`` per rank; a long window reads the
        rollups and draws each bucket's minimum and maximum at the times they occurred."""
        if max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {max_points}")
        with self._state_lock:
            t: TeleRun | None = self._mirror.tele.get(run)
            done = {w: self._mirror.tele_done.get((run, w)) for w in LEVELS}
        if t is None or name not in t.names:
            return {}
        lo = t.lo if start is None else max(float(start), t.lo)
        hi = t.hi if end is None else min(float(end), t.hi)
        if hi < lo:
            return {}
        where = "run = $run AND name = $name AND time BETWEEN $lo AND $hi"
        params: dict[str, Any] = {"run": run, "name": name, "lo": lo, "hi": hi}
        if ranks is not None:
            keep = sorted({int(r) for r in ranks} & t.ranks)
            if not keep:
                return {}
            where += f" AND rank IN ({', '.join(map(str, keep))})"
        width = _level(hi - lo, t.interval(), max_points)
        with self._query() as cur:
            if width is None:
                sql = f"SELECT rank, time, value FROM telemetry WHERE {where} ORDER BY rank, time"
                return _decimate(_by_rank(cur.execute(sql, params).fetchall()), max_points)
            edge = done[width] if done[width] is not None else -math.inf
            params["edge"] = edge
            buckets = f"b BETWEEN floor($lo / {width}) AND floor($hi / {width})"
            wb = where.replace("time BETWEEN $lo AND $hi", buckets)
            sql = (
                "SELECT rank, min(mn) AS mn, arg_min(t_mn, mn) AS t_mn, max(mx) AS mx, "
                "arg_max(t_mx, mx) AS t_mx FROM ("
                f"SELECT rank, b, mn, t_mn, mx, t_mx FROM telemetry_l{width} WHERE {wb} "
                f"UNION ALL SELECT rank, CAST(floor(time / {width}) AS BIGINT) AS b, value, time, "
                f"value, time FROM telemetry WHERE {where} AND time >= $edge"
                ") GROUP BY rank, b ORDER BY rank, b"
            )
            rows = cur.execute(sql, params).fetchall()
        points = []
        for rank, mn, t_mn, mx, t_mx in rows:
            pair = sorted({(t_mn, mn), (t_mx, mx)}, key=lambda p: p[0])
            points += [(rank, tt, v) for tt, v in pair]
        return _decimate(_by_rank(points), max_points)

    def telemetry_band(
        self,
        run: str,
        name: str,
        start: float | None = None,
        end: float | None = None,
        max_points: int = 1000,
    ) -> dict[str, list[float]]:
        """The cross-rank band over time: per time bucket the median, 5th and 95th
        percentile, minimum and maximum across ranks (of each rank's mean in the bucket)."""
        with self._state_lock:
            t: TeleRun | None = self._mirror.tele.get(run)
            done = {w: self._mirror.tele_done.get((run, w)) for w in LEVELS}
        empty: dict[str, list[float]] = {k: [] for k in BAND_KEYS}
        if t is None or name not in t.names:
            return empty
        lo = t.lo if start is None else max(float(start), t.lo)
        hi = t.hi if end is None else min(float(end), t.hi)
        if hi < lo:
            return empty
        step = max(t.interval(), (hi - lo) / max(1, max_points - 1))
        level = _level(hi - lo, t.interval(), max_points)
        params: dict[str, Any] = {"run": run, "name": name, "lo": lo, "hi": hi, "w": step}
        raw = "SELECT rank, time, value FROM telemetry WHERE run = $run AND name = $name AND " \
              "time BETWEEN $lo AND $hi"  # fmt: skip
        if level is not None and done[level] is not None:
            params["edge"] = done[level]
            raw = (
                f"SELECT rank, (t_mn + t_mx) / 2 AS time, s / n AS value FROM telemetry_l{level} "
                f"WHERE run = $run AND name = $name AND b BETWEEN floor($lo / {level}) AND "
                f"floor($hi / {level}) AND (b + 1) * {level} <= $edge "
                f"UNION ALL {raw} AND time >= $edge"
            )
        sql = (
            "SELECT b * $w AS time, quantile_cont(v, 0.5), quantile_cont(v, 0.05), "
            "quantile_cont(v, 0.95), min(v), max(v) FROM (SELECT rank, "
            "CAST(floor(time / $w) AS BIGINT) AS b, avg(value) AS v FROM (" + raw + ") "
            "WHERE NOT isnan(value) GROUP BY rank, b) GROUP BY b ORDER BY b"
        )
        with self._query() as cur:
            rows = cur.execute(sql, params).fetchall()
        cols = list(zip(*rows, strict=True)) if rows else [() for _ in BAND_KEYS]
        return {k: [float(v) for v in col] for k, col in zip(BAND_KEYS, cols, strict=True)}

    def telemetry_latest(self, run: str) -> dict[int, dict[str, float]]:
        """rank -> name -> its latest stored value (a run the live state no longer holds)."""
        with self._state_lock:
            t = self._mirror.tele.get(run)
        if t is None:
            return {}
        since = t.hi - 3 * t.interval() - 60.0
        with self._query() as cur:
            rows = cur.execute(
                "SELECT rank, name, arg_max(value, time) FROM telemetry WHERE run = ? AND "
                "time >= ? GROUP BY rank, name",
                [run, since],
            ).fetchall()
        out: dict[int, dict[str, float]] = {}
        for rank, name, value in rows:
            out.setdefault(int(rank), {})[name] = float(value)
        return out

    def telemetry_hosts(self, run: str) -> dict[int, dict[str, str]]:
        """rank -> {"host", "device"}: where each rank's card was last (its host label)."""
        with self._query() as cur:
            rows = cur.execute(
                "SELECT rank, arg_max(value, device <> ''), arg_max(device, device <> '') FROM "
                "telemetry_labels_last WHERE run = ? AND name = 'host' GROUP BY rank",
                [run],
            ).fetchall()
        return {int(rank): {"host": host, "device": device} for rank, host, device in rows}

    def telemetry_labels(self, run: str) -> list[dict[str, Any]]:
        """Every stored label change of ``run`` (host, health, throttle words), by time."""
        with self._query() as cur:
            rows = cur.execute(
                "SELECT rank, time, source, device, name, value FROM telemetry_labels "
                "WHERE run = ? ORDER BY time, rank, name",
                [run],
            ).fetchall()
        keys = ("rank", "time", "source", "device", "name", "value")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def export_telemetry(self, run: str, out_path: Path, fmt: str) -> int:
        """Write ``run``'s telemetry as long rows (run, rank, inc, time, source, device, name,
        value) to ``out_path``; returns the rows written."""
        options = "FORMAT CSV, HEADER" if fmt == "csv" else "FORMAT PARQUET"
        target = str(out_path).replace("'", "''")
        with self._query() as cur:
            row = cur.execute(
                "COPY (SELECT run, rank, inc, time, source, device, name, value FROM telemetry "
                "WHERE run = ? ORDER BY rank, time, name) "
                f"TO '{target}' ({options})",
                [run],
            ).fetchone()
        return int(row[0]) if row else 0


def _level(span: float, interval: float, max_points: int) -> int | None:
    """The rollup width to read a window of ``span`` seconds at, None for the raw rows."""
    if span / max(interval, 1e-9) <= max_points:
        return None
    for width in LEVELS:
        if 2 * span / width <= max_points:
            return width
    return LEVELS[-1]


def _by_rank(rows: Sequence[tuple]) -> Series:
    out: Series = {}
    for rank, t, value in rows:
        series = out.get(rank)
        if series is None:
            series = out[int(rank)] = {"time": [], "value": []}
        series["time"].append(float(t))
        series["value"].append(float(value))
    return out


def _decimate(series: Series, max_points: int) -> Series:
    """At most ``max_points`` per rank: each chunk's minimum and maximum, in time order."""
    for rank, s in series.items():
        n = len(s["time"])
        if n <= max_points:
            continue
        chunk = math.ceil(2 * n / max_points)
        times, values = [], []
        for i in range(0, n, chunk):
            ts, vs = s["time"][i : i + chunk], s["value"][i : i + chunk]
            finite = [j for j, v in enumerate(vs) if v == v] or [0]
            lo = min(finite, key=vs.__getitem__)
            hi = max(finite, key=vs.__getitem__)
            for j in sorted({lo, hi}):
                times.append(ts[j])
                values.append(vs[j])
        series[rank] = {"time": times, "value": values}
    return series
