"""Benchmarks for airflow-provider-bos (targets P1-P4). Entry point: ``bench/run``."""
