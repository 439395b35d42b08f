"""Report section: the workloads' length statistics and provenance."""

from __future__ import annotations

import pandas as pd

from dcp_bench.report.data import ReportData, scrub_paths, shown_path
from dcp_bench.report.document import Document


def workloads_section(doc: Document, data: ReportData) -> None:
    c = data.campaign
    if c.runs.empty:
        return
    rows = []
    for name in sorted(set(c.runs["workload"])):
        info = c.workloads.get(name, {})
        prov = info.get("provenance") or {}
        data_file = prov.get("data_file")
        rows.append(
            {
                "workload": name,
                "description": info.get("description", ""),
                "source": scrub_paths(prov.get("source", "not recorded")),
                "licence": prov.get("licence", "not recorded"),
                "data file": shown_path(data_file) if data_file else "-",
                "sha256": prov.get("data_sha256", "-"),
            }
        )
    doc.h2("Workloads and their data")
    doc.p(
        "What the runs recorded about their workload (`run.json` -> `extra.workload`): the "
        "config's description, source and licence, and the SHA-256 of the data file the runs read."
    )
    doc.table(pd.DataFrame(rows), "")
