"""Personal data by policy: hash or drop fields of a record before it is stored.

The core (policy, fields, keyed hash, plan, fingerprint) imports no Airflow; :mod:`.airflow_key`
reads the key from an Airflow Connection or Variable. docs/personal-data.md is the user's page.
How the write path is to use it::

    from airflow_provider_bos.pii.airflow_key import key_from_connection

    policy = PiiPolicy.parse({"email": "hash", "attributes.employment.*": "drop"})  # at DAG parse
    plan = policy.plan(key_from_connection("bos_pii_key") if policy.needs_key else None)
    plan.fingerprint.require_same(stored_fingerprint_text, table="bos_people")
    stored = plan.apply(record)
"""

from __future__ import annotations

from airflow_provider_bos.pii.fields import FieldName, parse_field
from airflow_provider_bos.pii.fingerprint import PiiPolicyMismatch, PolicyFingerprint
from airflow_provider_bos.pii.keyed_hash import PiiKey, hash_value, lookup_hash, normalise
from airflow_provider_bos.pii.plan import PiiPlan
from airflow_provider_bos.pii.policy import PiiAction, PiiPolicy

__all__ = [
    "FieldName",
    "PiiAction",
    "PiiKey",
    "PiiPlan",
    "PiiPolicy",
    "PiiPolicyMismatch",
    "PolicyFingerprint",
    "hash_value",
    "lookup_hash",
    "normalise",
    "parse_field",
]
