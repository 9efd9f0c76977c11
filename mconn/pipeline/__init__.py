"""The fleet telemetry pipeline: mconn's telemetry files in, tables and a report out, on Spark.

Installed with the ``pipeline`` extra (``pip install 'mconn[pipeline]'``: pyspark and
matplotlib; Spark needs a Java runtime). The core library never imports this package.
Run it as ``mconn-pipeline`` (cli.py), ``python -m mconn.pipeline``, or spark-submit of
cli.py; ``job.run`` is the same from Python. specs/pipeline.md describes every table.
``mconn-pipeline --follow DIR`` (follow.py, its page follow_page.py) keeps the links,
reconnects and delivery_audit tables current from a running fleet's closed telemetry files.
"""
