"""Tools that run beside the library, not inside it: the one-command GPU check and calibration
(`scripts/gpu_check.sh`, `scripts/gpu_calibrate.sh`) and the report's Chromium layout check
(`scripts/report_screenshots.py`). They import `dcp_bench`; nothing in `dcp_bench` imports them.
They run from the repository (its root on ``PYTHONPATH``) and are not installed with the package."""
