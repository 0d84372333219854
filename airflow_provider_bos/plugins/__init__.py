"""Airflow UI adapters: the Admin -> BOS page (grant health, Connect / Reconnect, Check).

Only adapters live here; the OAuth client is :mod:`airflow_provider_bos.auth`, reused as the CLI
uses it. Registered through the provider info ``plugins`` key and the ``airflow.plugins`` entry point.
"""
