"""Benchmarks for airflow-provider-bos (issue 6: targets P1-P4). Entry point: ``bench/run``."""
