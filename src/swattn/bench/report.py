"""From timings to the tables: window-aware FLOPs and bytes, the floor, the roofline
fraction, ratios to the fastest peer that computes the same function, the tile model's
prediction beside the measurement (:mod:`.predict`); written as markdown, CSV and JSON, one
set per kind (``extend.*``, ``decode.*``).

The arithmetic here is plain Python (tested without a GPU); only :func:`collect_meta`
asks torch about the device.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import os
import shlex
import subprocess

from .harness import same_function, summarize
from .predict import (
    decode_tile_prediction,
    expected_decode_tiling,
    expected_tiling,
    floor_us,
    tile_prediction,
)

CSV_FIELDS = ("case", "variant", "key", "role", "status", "median_us", "p20_us", "p80_us", "reps",
              "graphed", "rel_err", "same_function", "other_fn", "computes", "tflops", "gbps",
              "floor_us",
              "roofline", "ratio_best_peer", "verdict", "ratio_tight", "verdict_tight",
              "host_run_us", "eager_run_us", "host_one_shot_us", "eager_one_shot_us", "note")
KINDS = ("extend", "decode")


# --------------------------------------------------------------------------------------
# Arithmetic.
# --------------------------------------------------------------------------------------

def roofline(floor, time_us):
    """Fraction of the roofline reached: floor / time (1.0 = at the floor)."""
    return None if not time_us else floor / time_us


def verdict(ratio, noise):
    """"no change" when ``ratio`` is within the noise floor of 1, else faster/slower."""
    if ratio is None:
        return ""
    if noise is not None and abs(ratio - 1.0) <= noise:
        return "no change"
    return "faster" if ratio < 1.0 else "slower"


# --------------------------------------------------------------------------------------
# Rows.
# --------------------------------------------------------------------------------------

def _dropped(result, case):
    """What of the case's function a variant leaves out: "" or "sinks", "sparse keys", ..."""
    sinks, sparse = same_function(result.applies_sinks, getattr(result, "applies_sparse", True),
                                  case)
    return ", ".join(what for what, kept in (("sinks", sinks), ("sparse keys", sparse)) if not kept)


def _same_function(result, case):
    return not _dropped(result, case) and not getattr(result, "computes", "")


def _rows(case_result, ceilings):
    """``(work, rows, best, best_us)``: the case's FLOPs, bytes and floor, one dict per
    variant (the CSV fields plus the per-round medians), and the fastest peer that computes
    the same function."""
    case = case_result.case
    flops, nbytes = case.flops(), case.bytes_moved()
    floor = floor_us(flops, nbytes, ceilings)
    stats = {r.name: summarize(r.rounds_us) for r in case_result.variants}
    peers = [r for r in case_result.variants if r.role == "peer" and r.status == "ok"
             and _same_function(r, case) and stats[r.name]["median_us"]]
    best = min(peers, key=lambda r: stats[r.name]["median_us"], default=None)
    best_us = stats[best.name]["median_us"] if best else None
    noise = case_result.noise
    rows = []
    for r in case_result.variants:
        s = stats[r.name]
        median = s["median_us"]
        ratio = median / best_us if (median and best_us) else None
        # A variant reading an fp8 copy of the cache moves fewer bytes: its own floor.
        kv = getattr(r, "kv_bytes", 2)
        r_bytes = nbytes if kv == 2 else case.bytes_moved(kv_element_size=kv)
        r_floor = floor if kv == 2 else floor_us(flops, r_bytes, ceilings)
        rows.append({
            "case": case.name, "variant": r.name, "key": r.key, "role": r.role, "status": r.status,
            "median_us": median, "p20_us": s["p20_us"], "p80_us": s["p80_us"],
            "reps": s.get("reps", 0), "round_medians_us": s["round_medians_us"],
            "graphed": r.graphed, "rel_err": r.rel_err, "same_function": _same_function(r, case),
            "other_fn": _dropped(r, case), "computes": getattr(r, "computes", ""),
            "tflops": flops / median / 1e6 if median else None,
            "gbps": r_bytes / median / 1e3 if median else None,
            "floor_us": r_floor, "roofline": roofline(r_floor, median), "ratio_best_peer": ratio,
            "verdict": ("fastest peer" if (best is not None and r is best)
                        else verdict(ratio, noise)),
            "note": r.note, "host_us": dict(getattr(r, "host_us", {}) or {}),
        })
    tight_us = next((row["median_us"] for row in rows if row["role"] == "tight"), None)
    for row in rows:
        row["ratio_tight"] = (row["median_us"] / tight_us if (row["median_us"] and tight_us)
                              else None)
        row["verdict_tight"] = verdict(row["ratio_tight"], noise) if row["role"] != "tight" else ""
    return (flops, nbytes, floor), rows, best, best_us


def case_report(case_result, ceilings):
    """``(summary, rows)`` of one case: a dict of the case's work and verdicts, and one
    dict per variant (the CSV fields plus the per-round medians). Decode cases get
    :func:`decode_case_report`."""
    case = case_result.case
    if getattr(case, "kind", "") == "decode":
        return decode_case_report(case_result, ceilings)
    (flops, nbytes, floor), rows, best, best_us = _rows(case_result, ceilings)
    noise = case_result.noise
    by_role = {row["role"]: row for row in rows if row["median_us"]}
    by_key = {row["key"]: row for row in rows if row["median_us"]}
    # The tiles of the plan that ran, else those it takes on an H200 (a prediction).
    tiling = next((r.tiling for r in case_result.variants if r.role == "tight" and r.tiling), None)
    prediction = tile_prediction(case, tiling=tiling or expected_tiling(case))
    tight, skip = by_role.get("tight"), by_key.get("skip")
    measured = tight["median_us"] / skip["median_us"] if (tight and skip) else None
    summary = {
        "case": case.name, "batch": case.batch, "seqs": [list(s) for s in case.seqs],
        "num_q_heads": case.num_q_heads, "num_kv_heads": case.num_kv_heads,
        "head_dim": case.head_dim, "head_dim_v": case.head_dim_v,
        "window_left": case.window_left, "sinks": case.sinks, "page_size": case.page_size,
        "attention_chunk": case.attention_chunk, "tree": list(case.tree),
        "visible_pairs": case.visible_pairs() * case.num_q_heads, "flops": flops, "bytes": nbytes,
        "floor_us": floor, "noise": noise, "best_peer": best.name if best else None,
        "best_peer_us": best_us,
        "tight_vs_best_peer": tight["median_us"] / best_us if (tight and best_us) else None,
        "tiles_tight": prediction["tight"], "tiles_skip": prediction["skip"],
        "predicted_tight_over_skip": prediction["ratio"], "measured_tight_over_skip": measured,
        "tiles_chunk_masked_only": prediction["chunk_masked_only"],
        "tiling": f"{prediction['block_m']}x{prediction['block_n']}",
        "seconds": case_result.seconds,
    }
    summary["verdict_tight_vs_skip"] = verdict(measured, noise)
    return summary, rows


def decode_case_report(case_result, ceilings):
    """``(summary, rows)`` of one decode case: the rows as for extend; the summary has the
    keys per sequence, the work, the floor, the noise, the fastest peer computing the same
    function, and the tight kernel against its skip and one-split rows."""
    case = case_result.case
    (flops, nbytes, floor), rows, best, best_us = _rows(case_result, ceilings)
    noise = case_result.noise
    by_role = {row["role"]: row for row in rows if row["median_us"]}
    by_key = {row["key"]: row for row in rows if row["median_us"]}
    tight = by_role.get("tight")

    def over(key):
        other = by_key.get(key)
        return tight["median_us"] / other["median_us"] if (tight and other) else None

    lens = sorted(set(case.seq_lens))
    tiling = next((r.tiling for r in case_result.variants if r.role == "tight" and r.tiling), None)
    prediction = decode_tile_prediction(case, tiling or expected_decode_tiling(case))
    summary = {
        "case": case.name, "kind": "decode", "batch": case.batch, "seq_lens": lens,
        "num_q_heads": case.num_q_heads, "num_kv_heads": case.num_kv_heads,
        "head_dim": case.head_dim, "head_dim_v": case.head_dim_v,
        "window_left": case.window_left, "sinks": case.sinks, "page_size": case.page_size,
        "attention_chunk": case.attention_chunk,
        "sparse_keys": case.sparse_keys,
        "sparse_valid": case.sparse_valid if case.sparse_keys else 0,
        "keys_per_seq": case.keys() / case.batch,
        "visible_pairs": case.visible_pairs() * case.num_q_heads, "flops": flops, "bytes": nbytes,
        "floor_us": floor, "noise": noise, "best_peer": best.name if best else None,
        "best_peer_us": best_us,
        "tight_vs_best_peer": tight["median_us"] / best_us if (tight and best_us) else None,
        "tight_over_skip": over("skip"), "tight_over_one_split": over("split1"),
        # Under a chunk: the same keys as a window (the "same-keys" row).
        "tight_over_same_keys_window": over("same-keys"),
        "tiles_tight": prediction["tight"], "tiles_all": prediction["all"],
        "predicted_tight_over_skip": prediction["ratio"],
        "tiling": f"BN{prediction['block_n']}" + (", aligned" if prediction["aligned"] else ""),
        "seconds": case_result.seconds,
    }
    summary["verdict_tight_vs_skip"] = verdict(summary["tight_over_skip"], noise)
    summary["verdict_tight_vs_one_split"] = verdict(summary["tight_over_one_split"], noise)
    summary["verdict_tight_vs_same_keys_window"] = verdict(summary["tight_over_same_keys_window"],
                                                           noise)
    return summary, rows


# --------------------------------------------------------------------------------------
# Formatting.
# --------------------------------------------------------------------------------------

def _num(x, fmt="{:.1f}", none="-"):
    return none if x is None else fmt.format(x)


def _err(x):
    if x is None:
        return "-"
    return "NaN" if math.isnan(x) else f"{x:.1e}"


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def _ratio(x, verdict_text=""):
    if x is None:
        return "-"
    return f"{x:.2f}x" + (f" ({verdict_text})" if verdict_text in ("no change", "fastest peer")
                          else "")


def _cell(text):
    return str(text).replace("|", "/").replace("\n", " ")


def _short_note(row):
    """The measurement table's note: why a row has no time, or what is unusual about it;
    each variant's full description is in the legend, the whole note in the CSV."""
    if row["status"] in ("skipped", "error"):
        return row["note"][:100]
    flags = []
    if row["median_us"] is not None and not row["graphed"]:
        flags.append("NOT graphed")
    if "differs" in row["note"]:
        flags.append("graph replay differs from eager")
    return "; ".join(flags)


def _status(row):
    if row["same_function"]:
        return row["status"]
    what = [f"no {row['other_fn']}"] if row["other_fn"] else []
    what += [row["computes"]] if row.get("computes") else []
    return f"{row['status']}, other fn ({'; '.join(what)})"


def _header(w, meta, ceilings, rows, kind):
    """Title, where and with what it ran, the ceilings, the method and the variants' legend."""
    w(f"# swattn {kind} attention benchmark\n\n")
    w(f"- date: {meta.get('date')}\n- GPU: {meta.get('gpu')} (driver {meta.get('driver')}, "
      f"CUDA {meta.get('cuda')})\n- torch {meta.get('torch')}, triton {meta.get('triton')}\n"
      f"- commit: {meta.get('commit')}\n- command: `{meta.get('command')}`\n")
    if meta.get("peers"):
        w(f"- {meta['peers']}\n")
    if ceilings:
        w(f"- ceilings, measured in this run: bf16 matmul 8192^3 "
          f"{ceilings['matmul_tflops']:.0f} TFLOP/s; device-to-device copy "
          f"{ceilings['copy_gbps']:.0f} GB/s (read + written"
          + "".join(f"; {size}: {gbps:.0f}"
                    for size, gbps in ceilings.get("copy_gbps_by_method", {}).items())
          + ")\n")
    w(f"- method: {meta.get('method', '')}\n\n")
    legend = {}
    for r in rows:
        if r["status"] in ("ok", "WRONG") and r["variant"] not in legend:
            legend[r["variant"]] = r["note"]
    if legend:
        w("Variants: " + "; ".join(f"**{_cell(k)}**: {_cell(v)}" for k, v in legend.items())
          + "\n\n")


def _table(w, columns, items):
    """A markdown table: ``columns`` are ``(header, cell)``, ``cell(item)`` the text."""
    w("| " + " | ".join(header for header, _ in columns) + " |\n")
    w("|" + "---|" * len(columns) + "\n")
    for item in items:
        w("| " + " | ".join(cell(item) for _, cell in columns) + " |\n")


def _measurement_columns(bandwidth):
    """One line per measurement; with ``bandwidth`` (decode) TFLOP/s to two decimals and a
    GB/s column beside it."""
    columns = [
        ("case", lambda r: r["case"]),
        ("variant", lambda r: r["variant"]),
        ("status", _status),
        ("median us", lambda r: _num(r["median_us"])),
        ("p20-p80 us",
         lambda r: "-" if r["p20_us"] is None else f"{r['p20_us']:.1f}-{r['p80_us']:.1f}"),
        ("TFLOP/s", lambda r: _num(r["tflops"], "{:.2f}" if bandwidth else "{:.1f}")),
    ]
    if bandwidth:
        columns.append(("GB/s", lambda r: _num(r["gbps"], "{:.0f}")))
    return columns + [
        ("roofline", lambda r: _pct(r["roofline"])),
        ("rel err", lambda r: _err(r["rel_err"])),
        ("vs fastest peer", lambda r: _ratio(r["ratio_best_peer"], r["verdict"])),
        ("vs swattn tight", lambda r: _ratio(r["ratio_tight"], r["verdict_tight"])),
        ("notes", lambda r: _cell(_short_note(r))),
    ]


def _case_columns(rows):
    """The columns every case line has, after its kind's own: floor, noise, fastest peer,
    and the tight variant against it and against the roofline."""
    def tight(s):
        return next((r for r in rows if r["case"] == s["case"] and r["role"] == "tight"), None)

    return [
        ("floor us", lambda s: _num(s["floor_us"])),
        ("noise floor", lambda s: _pct(s["noise"])),
        ("fastest peer (same function)",
         lambda s: _cell(f"{s['best_peer']} {s['best_peer_us']:.1f} us" if s["best_peer"]
                         else "-")),
        ("swattn tight / it", lambda s: _ratio(s["tight_vs_best_peer"])),
        ("roofline, tight", lambda s: _pct(tight(s)["roofline"] if tight(s) else None)),
    ]


def _host_table(w, rows):
    """What a caller's CPU pays: per swattn row with host times, the graph-replayed time,
    the host time of a ``plan.run`` call and of the one-shot function, and the time a call
    of each run eagerly back to back."""
    timed = [r for r in rows if r.get("host_us")]
    if not timed:
        return
    w("\n## Host time of a call (us)\n\n")

    def host(name):
        return lambda r: _num(r["host_us"].get(name))

    _table(w, [
        ("case", lambda r: r["case"]),
        ("variant", lambda r: r["variant"]),
        ("graph replay", lambda r: _num(r["median_us"])),
        ("plan.run: host", host("plan.run")),
        ("plan.run: eager", host("plan.run (eager)")),
        ("one-shot: host", host("one-shot")),
        ("one-shot: eager", host("one-shot (eager)")),
    ], timed)


def markdown(meta, ceilings, summaries, rows):
    """The report: header (GPU, versions, commit, command, date, ceilings, method), a legend
    of the variants, one line per measurement, and last one line per case (work, floor,
    noise, fastest peer, tile prediction vs measurement)."""
    out = io.StringIO()
    w = out.write
    _header(w, meta, ceilings, rows, "extend")
    w("## Measurements\n\n")
    _table(w, _measurement_columns(False), rows)
    w("\n## Cases\n\n")
    _table(w, [
        ("case", lambda s: s["case"]),
        ("visible pairs", lambda s: f"{s['visible_pairs'] / 1e6:.1f}M"),
        ("GFLOP", lambda s: f"{s['flops'] / 1e9:.1f}"),
        ("MB", lambda s: f"{s['bytes'] / 1e6:.1f}"),
        *_case_columns(rows),
        ("tiles tight/skip, predicted",
         lambda s: f"{_num(s['predicted_tight_over_skip'], '{:.3f}')} "
                   f"({s['tiles_tight']:,}/{s['tiles_skip']:,}, {s['tiling']})"
                   + (f"; the chunk masked only: {s['tiles_chunk_masked_only']:,}"
                      if s.get("tiles_chunk_masked_only") is not None else "")),
        ("measured", lambda s: f"{_num(s['measured_tight_over_skip'], '{:.3f}')} "
                               f"{s['verdict_tight_vs_skip']}"),
    ], summaries)
    _host_table(w, rows)
    return out.getvalue()


def decode_markdown(meta, ceilings, summaries, rows):
    """The decode report, in the extend report's style: header, legend, one line per
    measurement (with GB/s: decode is bandwidth-bound), then one line per case (keys per
    sequence, work, floor, noise, fastest peer, the tiles predicted, tight against skip and
    one split)."""
    out = io.StringIO()
    w = out.write
    _header(w, meta, ceilings, rows, "decode")
    w("## Measurements\n\n")
    _table(w, _measurement_columns(True), rows)
    w("\n## Cases\n\n")

    def keys(s):
        return f"{s['keys_per_seq']:g}" + (f" ({s['sparse_valid']} sparse)" if s["sparse_keys"]
                                           else "")

    _table(w, [
        ("case", lambda s: s["case"]),
        ("batch", lambda s: f"{s['batch']}"),
        ("keys / sequence", keys),
        ("GFLOP", lambda s: f"{s['flops'] / 1e9:.3f}"),
        ("MB", lambda s: f"{s['bytes'] / 1e6:.1f}"),
        *_case_columns(rows),
        ("tiles tight/all, predicted",
         lambda s: f"{_num(s['predicted_tight_over_skip'], '{:.3f}')} "
                   f"({s['tiles_tight']:,}/{s['tiles_all']:,}, {s['tiling']})"),
        ("tight / skip", lambda s: f"{_num(s['tight_over_skip'], '{:.3f}')} "
                                   f"{s['verdict_tight_vs_skip']}"),
        ("tight / 1 split", lambda s: f"{_num(s['tight_over_one_split'], '{:.3f}')} "
                                      f"{s['verdict_tight_vs_one_split']}"),
    ], summaries)
    _host_table(w, rows)
    return out.getvalue()


def to_csv(rows):
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        host = row.get("host_us") or {}
        writer.writerow(dict(row, host_run_us=host.get("plan.run"),
                             eager_run_us=host.get("plan.run (eager)"),
                             host_one_shot_us=host.get("one-shot"),
                             eager_one_shot_us=host.get("one-shot (eager)")))
    return out.getvalue()


def write(out_dir, meta, ceilings, case_results, kind="extend"):
    """Write ``<kind>.md``, ``<kind>.csv`` and ``<kind>.json`` (kind ``extend`` or
    ``decode``) into ``out_dir``; returns the markdown."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    summaries, rows = [], []
    for result in case_results:
        summary, case_rows = case_report(result, ceilings)
        summaries.append(summary)
        rows.extend(case_rows)
    text = (decode_markdown if kind == "decode" else markdown)(meta, ceilings, summaries, rows)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{kind}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, f"{kind}.csv"), "w") as f:
        f.write(to_csv(rows))
    raw = {r.case.name: {v.name: v.rounds_us for v in r.variants} for r in case_results}
    with open(os.path.join(out_dir, f"{kind}.json"), "w") as f:
        json.dump({"meta": meta, "ceilings": ceilings, "cases": summaries, "rows": rows,
                   "raw_us": raw}, f, indent=1, default=str)
    return text


# --------------------------------------------------------------------------------------
# Where and with what it ran.
# --------------------------------------------------------------------------------------

def _run(cmd):
    try:
        return subprocess.run(cmd, check=False, capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit():
    """``$SWATTN_COMMIT`` if set (a copy of the tree without ``.git``), else ``HEAD``
    (``+dirty`` with uncommitted changes), else "none"."""
    if os.environ.get("SWATTN_COMMIT"):
        return os.environ["SWATTN_COMMIT"]
    head = _run(["git", "rev-parse", "--short=12", "HEAD"])
    if not head:
        return "none (not a git checkout, or no commit yet)"
    return head + ("+dirty" if _run(["git", "status", "--porcelain", "--untracked-files=no"])
                   else "")


def collect_meta(command, method=""):
    """GPU, driver, versions, commit, the exact command and the date (UTC)."""
    import torch
    import triton
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    driver = _run(["nvidia-smi", "--query-gpu=driver_version",
                   "--format=csv,noheader"]).split("\n")[0]
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": gpu, "driver": driver or "unknown", "cuda": torch.version.cuda,
            "torch": torch.__version__, "triton": triton.__version__, "commit": git_commit(),
            "command": command if isinstance(command, str) else shlex.join(command),
            "method": method}
