"""Statistics, figures and the report writer (``dcp-bench report``)."""
