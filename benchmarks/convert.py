"""Criteo conversion: throughput and peak memory of ``python -m runner.prepare criteo`` on a generated log.

One generated Criteo-format ``train.txt`` (``runner.tasks.criteo.synthetic.write_logs``: 13 integer and 26
categorical fields a line, the click model's values), about 2 GB (``--quick``: about 4 MB). Each reading
runs in its own process, so its peak RSS is its own:

- **convert**: ``runner.tasks.criteo.prepare.convert``, the command's work (parse in blocks, split 90/5/5,
  count the vocabulary, write the shards);
- **pyarrow read**: ``pyarrow.csv.read_csv`` of the same file into one table (tab-separated, no header):
  the raw parse rate of a well-kept C++ reader, which holds the whole file in memory.

MB/s is the file's size over the wall time. The target: converting 2 GB stays under 1 GB of peak RSS (the
conversion streams; the pyarrow read is not expected to).
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from . import common

FULL = dict(lines=9_000_000)
QUICK = dict(lines=20_000)
RSS_TARGET = 1 << 30


def child(payload: dict) -> dict:
    path, kind = Path(payload["path"]), payload["kind"]
    t = time.perf_counter()
    if kind == "convert":
        from runner.tasks.criteo.prepare import convert

        out = Path(payload["out"])
        manifest = convert([path], out)
        extra = {"examples": sum(int(v["examples"]) for v in manifest["splits"].values())}
    else:
        import pyarrow.csv as pacsv

        table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(autogenerate_column_names=True),
                               parse_options=pacsv.ParseOptions(delimiter="\t"))
        extra = {"examples": table.num_rows}
    return {"seconds": time.perf_counter() - t, "peak_rss": common.peak_rss_bytes(), **extra}


def run(quick: bool, out: Path) -> dict:
    from runner.tasks.criteo.synthetic import CriteoSpec, write_logs

    cfg = QUICK if quick else FULL
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    try:
        t = time.perf_counter()
        (path,) = write_logs(CriteoSpec(lines=cfg["lines"], days=1), work / "logs")
        generated = time.perf_counter() - t
        size = path.stat().st_size
        print(f"generated {cfg['lines']:,} lines, {size / 1e6:,.0f} MB in {generated:.0f} s", flush=True)
        res = {}
        for kind in ("convert", "pyarrow read"):
            r = common.run_child("convert", {"path": str(path), "kind": kind, "out": str(work / "converted")},
                                 timeout=7200)
            r["mb_per_s"] = size / 1e6 / r["seconds"]
            res[kind] = r
            print(f"{kind:14s} {r['seconds']:7.1f} s  {r['mb_per_s']:6.1f} MB/s  peak RSS "
                  f"{r['peak_rss'] / 2**20:,.0f} MiB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    data = {"config": {**cfg, "file_bytes": size}, "results": res,
            "convert_over_pyarrow": res["convert"]["mb_per_s"] / res["pyarrow read"]["mb_per_s"],
            "targets": [common.target("peak RSS converting the file, MiB", res["convert"]["peak_rss"] / 2**20,
                                      RSS_TARGET / 2**20, "lower")] if size >= 1.5e9 else []}
    rows = [[k, f"{r['seconds']:.1f}", f"{r['mb_per_s']:.1f}", f"{r['peak_rss'] / 2**20:,.0f}"]
            for k, r in res.items()]
    body = (f"A generated Criteo-format `train.txt` of {cfg['lines']:,} lines, {size / 1e6:,.0f} MB; each reading "
            f"in its own process. {common.machine_line()}.\n\n"
            + common.md_table(["reading", "seconds", "MB/s", "peak RSS MiB"], rows)
            + f"\n\nThe conversion runs at {data['convert_over_pyarrow']:.2f}x pyarrow's read rate of the same file.")
    if data["targets"]:
        body += "\n\n## Targets\n\n" + common.md_table(["target", "measured", "wanted", ""],
                                                     [common.target_row(t) for t in data["targets"]])
    common.write_result(out, "convert", "Criteo conversion: throughput and peak memory", body, data)
    return data


def main(argv=None) -> None:
    common.main(__doc__, run, child, argv)


if __name__ == "__main__":
    main()
