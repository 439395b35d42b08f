"""The report's sections, one module each: a section is a function ``(Document, ReportData) ->
None`` that `dcp_bench.report.writer.report_sections` puts in reading order."""
