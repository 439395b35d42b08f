"""`build_report`: a campaign's run records -> reports/<campaign>/ (report.md, report.html, CSV
tables, figures, summary.json).

The report leads with what the campaign has, in the same order for every campaign: the answer on
the first screen (`first_screen`: a campaign that holds a claim's runs opens with the verdict and
one forest plot of every headline comparison; any other, a user's own, with its methods against
its baselines), then the evidence section by section, then the method-label glossary, the
provenance and an appendix of long tables. Sections whose data the campaign lacks are left out
rather than shown empty. Every number traces to its run
records: the cells table names each cell's config hash (``<root>/<campaign>/<run_id>/config.yaml``
holds the config), the provenance section names the command, git sha and system description,
and simulated numbers name their cost-model source and its measured error. No absolute local
path appears in any report file.

A section is a function ``(Document, ReportData) -> None``, one module each in
`dcp_bench.report.sections` (the first screen, peers, planning, memory and adoption sections sit
beside this module); `report_sections` orders them. A new section is one such module and one entry
in that list. The data every section reads is `dcp_bench.report.data.ReportData`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dcp_bench.paths import REPORTS_DIR
from dcp_bench.report.adoption import adoption_section

# what callers of the writer import from it
from dcp_bench.report.data import (  # noqa: F401
    ReportData,
    ReportInputs,
    evidence,
    gather_report_data,
    scrub_paths,
    shown_path,
)
from dcp_bench.report.document import Document
from dcp_bench.report.first_screen import first_screen_section, glossary_section
from dcp_bench.report.peers import peer_section
from dcp_bench.report.planning import machine_bound_section, planning_cost_section
from dcp_bench.report.sections.calibration import calibration_section
from dcp_bench.report.sections.cells import cells_section
from dcp_bench.report.sections.comparisons import comparison_section
from dcp_bench.report.sections.contexts import context_section
from dcp_bench.report.sections.decomposition import decomposition_section
from dcp_bench.report.sections.headline import headline_section
from dcp_bench.report.sections.measurement import measurement_section
from dcp_bench.report.sections.opening import opening_section
from dcp_bench.report.sections.provenance import provenance_section
from dcp_bench.report.sections.reference import reference_section
from dcp_bench.report.sections.scaling import scaling_section
from dcp_bench.report.sections.sensitivity import sensitivity_section
from dcp_bench.report.sections.system_validation import system_validation_section
from dcp_bench.report.sections.verdict import verdict_section
from dcp_bench.report.sections.workloads import workloads_section
from dcp_bench.report.summary import write_summary

Section = Callable[[Document, "ReportData"], None]


def report_sections(data: ReportData) -> list[Section]:
    """The sections in reading order. The first screen gives the answer (the claims' verdict
    when the campaign holds a claim's runs, else its own methods against its baselines), the
    section that answer comes from follows it, then the rest of the evidence, the glossary and
    provenance; long tables land in the appendix (`Document.table`)."""
    claim_sections: list[Section] = [
        verdict_section,
        system_validation_section,
        headline_section,
        reference_section,
        decomposition_section,
        sensitivity_section,
        calibration_section,
    ]
    lead: list[Section] = (
        [*claim_sections, opening_section, comparison_section]
        if data.leads_with_claims
        else [comparison_section, opening_section, *claim_sections]
    )
    return [
        first_screen_section,
        *lead,
        peer_section,
        machine_bound_section,
        planning_cost_section,
        context_section,
        scaling_section,
        measurement_section,
        cells_section,
        workloads_section,
        adoption_section,
        glossary_section,
        provenance_section,
    ]


def build_report(inp: ReportInputs) -> dict[str, Any]:
    """Write the report; return the summary (also written as summary.json)."""
    data = gather_report_data(inp)
    doc = Document(inp.title or f"dcp-bench report: {inp.campaign}")
    for section in report_sections(data):
        section(doc, data)
    paths = doc.write(Path(inp.out_dir))
    return write_summary(data, paths)


def default_out_dir(campaign: str) -> Path:
    return REPORTS_DIR / campaign
