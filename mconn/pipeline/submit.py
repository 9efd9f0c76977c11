"""``mconn-pipeline-submit``: the pipeline through spark-submit, from the installed pyspark.

    mconn-pipeline-submit [SPARK-SUBMIT OPTIONS] -- LOGS... --out DIR [PIPELINE OPTIONS]

It runs the installed pyspark's ``bin/spark-submit`` with the pipeline (cli.py) as the
application, in client mode (the driver runs here and writes the report), and with the
environment spark-submit needs, so it works without an activated venv
(specs/pipeline.md section 6):

* ``SPARK_HOME``: the installed pyspark. Without it, pyspark's ``spark-submit`` looks
  for pyspark with the first ``python3`` on PATH, which outside the venv has none
  ("Could not find valid SPARK_HOME", exit 127);
* ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``: this interpreter, the one that has
  mconn (the executors run no Python: the job is DataFrame operations only);
* the driver JVM's log4j2 configuration (``SPARK_SUBMIT_OPTS``): warnings only from its
  first line, unless the Spark configuration directory has a ``log4j2.properties``.

The arguments after ``--`` are the pipeline's, checked here first: a usage error exits
with 2 and a missing input path with 1, one line each, before any JVM starts.
"""

from __future__ import annotations

import os
import sys
import typing

PROG = "mconn-pipeline-submit"


def command(
    spark_args: list[str], pipeline_args: list[str], environ: typing.Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command line and its environment."""
    import pyspark

    from mconn.pipeline import cli
    from mconn.pipeline.spark import _log4j_file

    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    env = dict(environ, SPARK_HOME=home, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    conf_dir = environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf")
    if not os.path.exists(os.path.join(conf_dir, "log4j2.properties")):
        options = f"{environ.get('SPARK_SUBMIT_OPTS', '')} -Dlog4j2.configurationFile=file:{_log4j_file()}"
        env["SPARK_SUBMIT_OPTS"] = options.strip()
    argv = [os.path.join(home, "bin", "spark-submit"), *spark_args, os.path.abspath(cli.__file__), *pipeline_args]
    return argv, env


def main(argv=None) -> int | str | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print(
            f"{PROG}: error: put -- between spark-submit's options and the pipeline's arguments "
            f"({PROG} --master spark://HOST:7077 -- LOGS --out DIR)",
            file=sys.stderr,
        )
        return 2
    split = argv.index("--")
    spark_args, pipeline_args = argv[:split], argv[split + 1 :]
    from mconn.pipeline import cli, inputs

    try:
        args = cli.parser().parse_args(pipeline_args)
    except SystemExit as exit:  # argparse printed the usage error
        return exit.code
    try:
        cli.resolve(args)  # its warnings come from the driver
    except inputs.InputError as error:
        print(f"mconn-pipeline: error: {error}", file=sys.stderr)
        return 1
    program, env = command(spark_args, pipeline_args, os.environ)
    sys.stdout.flush()
    os.execve(program[0], program, env)


if __name__ == "__main__":
    sys.exit(main())
