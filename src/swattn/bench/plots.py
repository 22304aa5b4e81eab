"""PNG plots of a benchmark's JSON (report.write's extend.json or decode.json): per
workload, the median time of every variant per case (log scale) and the roofline fraction of
each. matplotlib is the `bench` extra; without it the plots are skipped with a note."""

import json
import os


def plot(json_path, out_dir=None):
    """Write ``<workload>_time.png`` and ``<workload>_roofline.png`` beside ``json_path`` (or
    into ``out_dir``); return the paths written, or a note why none were."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'swattn[bench]'): no plots"
    with open(json_path) as f:
        data = json.load(f)
    out_dir = out_dir or os.path.dirname(os.path.abspath(json_path))
    rows = [r for r in data["rows"] if r.get("median_us") is not None]
    workloads = sorted({r["case"].split(" ")[0] for r in rows})
    meta = data.get("meta", {})
    title = (f"{meta.get('gpu', '?')}, torch {meta.get('torch', '?')}, "
             f"triton {meta.get('triton', '?')}, commit {meta.get('commit', '?')}")
    written = []
    for workload in workloads:
        mine = [r for r in rows if r["case"].split(" ")[0] == workload]
        cases = list(dict.fromkeys(r["case"] for r in mine))
        variants = list(dict.fromkeys(r["variant"] for r in mine))
        for metric, label, log in (("median_us", "median time, us (log)", True),
                                   ("roofline", "fraction of the roofline", False)):
            fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4.5))
            width = 0.8 / len(variants)
            for i, variant in enumerate(variants):
                values = [next((r[metric] for r in mine
                                if r["case"] == c and r["variant"] == variant
                                and r.get(metric) is not None), 0.0) for c in cases]
                ax.bar([x + i * width for x in range(len(cases))], values, width, label=variant)
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cases))])
            ax.set_xticklabels([(c.split(" ", 1) + [c])[1] for c in cases], fontsize=8)
            if log:
                ax.set_yscale("log")
            ax.set_ylabel(label)
            ax.set_title(f"workload {workload}: {title}", fontsize=8)
            ax.legend(fontsize=6, ncol=2)
            fig.tight_layout()
            path = os.path.join(out_dir, f"{workload}_{'time' if log else 'roofline'}.png")
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written
