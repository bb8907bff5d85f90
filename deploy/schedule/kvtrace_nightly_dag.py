"""Airflow DAG: every night at 02:00 UTC, anonymize the previous day's logs on Dataflow.

The task runs `python -m kvtrace.nightly --config=... --date=YYYY-MM-DD` through the Apache Beam
provider's operator, so the Airflow worker needs kvtrace installed (`pip install "kvtrace[gcp]"`
beside apache-airflow-providers-apache-beam) and the presets at KVTRACE_CONFIGS. Dataflow runs
the job in the kvtrace image the presets name; the salt stays in Secret Manager.

max_active_runs=1: an id map takes one writer at a time, so nights run one after another (a
backfill runs them in date order, which is also what makes the nightly traces concatenate).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from airflow.sdk import DAG
from airflow.timetables.trigger import CronTriggerTimetable

CONFIGS = os.environ.get("KVTRACE_CONFIGS", "/opt/kvtrace/configs")
MODEL_PRESET = os.environ.get("KVTRACE_MODEL_PRESET", "deepseek-r1.yaml")

with DAG(
    dag_id="kvtrace_nightly",
    description="Anonymize yesterday's request logs into a Mooncake trace, extending the id map",
    schedule=CronTriggerTimetable("0 2 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["kvtrace"],
) as dag:
    BeamRunPythonPipelineOperator(
        task_id="anonymize",
        py_file="kvtrace.nightly",
        py_options=["-m"],
        runner="DataflowRunner",
        pipeline_options={
            "config": [f"{CONFIGS}/{MODEL_PRESET}", f"{CONFIGS}/dataflow.yaml"],
            # The run at 02:00 on day D exports day D-1, whose logs are complete by then.
            "date": "{{ macros.ds_add(ds, -1) }}",
        },
        dataflow_config={
            "job_name": "kvtrace-{{ macros.ds_add(ds, -1) }}",
            "wait_until_finished": True,
        },
        retries=1,  # a rerun of a night gives the same trace and extends the map once
    )
