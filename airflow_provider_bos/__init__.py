"""airflow-provider-bos: Apache Airflow provider for BOS federated identity reads."""

from __future__ import annotations

__version__ = "0.2.0"
