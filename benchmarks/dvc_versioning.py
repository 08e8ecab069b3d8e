"""DVC versioning of a gold date against `md5sum` of the same files.

`bench_dvc_versioning(sizes, scratch)` writes a gold date of `rows` customer and merchant rows (the
feature-store benchmark's generator: random feature values, which compress as badly as real ones), makes the
installation's DVC repository (as the first versioned date does, outside the timing), then measures, each in a
process of its own (_measure.py: wall time, peak RSS of the process tree):
  - the floor: `md5sum` of the date's Parquet files, after one unmeasured pass so both read from the page
    cache (DVC's content hash is this md5; it cannot be had for less);
  - ours: `mlops features --date D --step version_gold`: hash both partitions, copy them into the DVC cache,
    push them to the remote (a local folder in the local profile) and record the revision;
  - ours again on the unchanged date: DVC's state database knows the files, so this is mostly the fixed cost
    of the six `dvc` commands the step runs (remote add, commit and push, per table);
  - DVC alone: `dvc add` + `dvc push` of the same files (hard links, same page cache) in a fresh repository,
    one command each, which is what versioning costs without our wrapping.
Throughput ratio = md5sum seconds / seconds (goal >= 0.8x).
Run: `python -m benchmarks --only dvc_versioning [--sizes 1000000,4000000]`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks._process import measure

HERE = Path(__file__).resolve().parent
DEFAULT_SIZES = [1_000_000]  # gold rows of one date; ~0.3 GB of Parquet


def bench_dvc_versioning(sizes: list[int], scratch: Path) -> list[dict]:
    from benchmarks.feature_store import DAY, write_gold_day

    mlops = str(Path(sys.executable).with_name("mlops"))
    dvc = str(Path(sys.executable).with_name("dvc"))
    results = []
    for rows in sizes:
        home = scratch / f"dvc-{rows}"
        write_gold_day(home / "lake", rows)
        env = {**os.environ, "MLOPS_HOME": str(home), "MLOPS_PROFILE": "local"}
        subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=home, check=True)
        subprocess.run([dvc, "config", "core.analytics", "false"], cwd=home, check=True)
        files = sorted(str(p) for p in (home / "lake" / "gold").rglob("*.parquet"))
        size = sum(Path(f).stat().st_size for f in files)
        md5sum = ["sh", "-c", 'md5sum "$@" > /dev/null && echo "{}"', "md5sum", *files]
        measure(md5sum)  # page cache
        base = measure(md5sum)
        version = [mlops, "features", "--date", DAY.date().isoformat(), "--step", "version_gold", "--json"]
        ours = measure(version, env)
        again = measure(version, env)
        raw = scratch / f"dvc-raw-{rows}"
        raw.mkdir()
        subprocess.run(["cp", "-al", str(home / "lake" / "gold"), str(raw / "gold")], check=True)
        subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=raw, check=True)
        subprocess.run([dvc, "config", "core.analytics", "false"], cwd=raw, check=True)
        subprocess.run([dvc, "remote", "add", "-d", "storage", str(raw / "remote")], cwd=raw, check=True)
        add_push = f'cd "{raw}" && "{dvc}" add -q gold && "{dvc}" push -q && echo "{{}}"'
        alone = measure(["sh", "-c", add_push])
        cache = home / ".dvc" / "cache"
        results.append(
            {
                "gold_rows": rows,
                "files": len(files),
                "mib": size / 2**20,
                "md5sum_seconds": base["seconds"],
                "version_seconds": ours["seconds"],
                "unchanged_seconds": again["seconds"],
                "md5sum_mib_s": size / 2**20 / base["seconds"],
                "version_mib_s": size / 2**20 / ours["seconds"],
                "throughput_ratio": base["seconds"] / ours["seconds"],
                "dvc_alone_seconds": alone["seconds"],
                "dvc_alone_ratio": base["seconds"] / alone["seconds"],
                "peak_mib": ours["peak_mib"],
                "md5sum_peak_mib": base["peak_mib"],
                "dataset_rev": ours["output"]["dataset_rev"],
                "cache_mib": sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 2**20,
            }
        )
        shutil.rmtree(home)
        shutil.rmtree(raw)
    return results


def print_dvc_versioning(console, results: list[dict]) -> None:
    from rich.table import Table

    table = Table(
        "gold rows",
        "files",
        "MiB",
        "md5sum s",
        "MiB/s",
        "version_gold s",
        "MiB/s",
        "ours / md5sum",
        "unchanged s",
        "dvc add+push s",
        "dvc alone / md5sum",
        "peak MiB",
        "md5sum peak MiB",
        title="DVC versioning of a gold date (hash + cache + push) vs md5sum of the same files "
        "(goal: throughput >= 0.8x md5sum)",
    )
    for r in results:
        table.add_row(
            f"{r['gold_rows']:,}",
            str(r["files"]),
            f"{r['mib']:.0f}",
            f"{r['md5sum_seconds']:.2f}",
            f"{r['md5sum_mib_s']:.0f}",
            f"{r['version_seconds']:.2f}",
            f"{r['version_mib_s']:.0f}",
            f"{r['throughput_ratio']:.2f}x",
            f"{r['unchanged_seconds']:.2f}",
            f"{r['dvc_alone_seconds']:.2f}",
            f"{r['dvc_alone_ratio']:.2f}x",
            f"{r['peak_mib']:.0f}",
            f"{r['md5sum_peak_mib']:.0f}",
        )
    console.print(table)
