"""What Prometheus sees, for the operator tests: a scrape parsed, and a real server.

``scrape``/``samples`` parse the 0.0.4 text exposition as Prometheus reads ``/metrics``
(with prometheus_client's parser) into ``{(sample name, frozenset of labels): value}``;
``value`` and ``by_label`` read that.

``Prometheus`` is Debian's ``/usr/bin/prometheus`` (``make`` installs it) on 127.0.0.1
with a free port, its TSDB in the test's temporary directory, scraping its targets (and
evaluating its rule file, if given) every second; PromQL goes through its HTTP API. Every
wait is bounded by TIMEOUT; ``stop`` ends the process by its PID.
"""

from __future__ import annotations

import json
import pathlib
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mconn.ops.metrics import SwitchMetrics

PROMETHEUS = pathlib.Path("/usr/bin/prometheus")
#: Bound on each wait for Prometheus, in seconds.
TIMEOUT = 25.0


# -- a scrape ----------------------------------------------------------------------------


def samples(text: str) -> dict:
    """{(sample name, frozenset of labels): value} of a 0.0.4 exposition."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(metrics: SwitchMetrics) -> dict:
    """``samples`` of one scrape of a Switch's own registry, rendered as ``/metrics`` is."""
    return samples(generate_latest(metrics.registry).decode())


def value(scraped: dict, name: str, **labels) -> float:
    """One sample's value; KeyError naming it, and the names there are, if absent."""
    key = (name, frozenset(labels.items()))
    if key not in scraped:
        raise KeyError(f"no sample {name}{labels}; have {sorted({k[0] for k in scraped})}")
    return scraped[key]


def by_label(scraped: dict, name: str, label: str) -> dict:
    """{label value: sample value} of one metric."""
    return {dict(labels)[label]: v for (n, labels), v in scraped.items() if n == name}


# -- the server --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    """(HTTP status, body); (0, b"") when there is no answer or an HTTP error."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except OSError:
        return 0, b""


class Prometheus:
    """/usr/bin/prometheus on 127.0.0.1 scraping ``targets`` every second (job ``mconn``),
    evaluating ``rule_file`` every second if one is given."""

    def __init__(self, directory: pathlib.Path, targets: list[str], rule_file: pathlib.Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = directory / "prometheus.yml"
        rules = f"rule_files:\n  - {json.dumps(str(rule_file))}\n" if rule_file is not None else ""
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"{rules}"
            "scrape_configs:\n  - job_name: mconn\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log = directory / "prometheus.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [
                    str(PROMETHEUS),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={directory / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                cwd=directory,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def api(self, path: str, **params) -> dict:
        """The ``data`` of a successful API answer; fails naming the error otherwise."""
        status, body = get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}")
        assert body, f"{path} {params}: HTTP {status}, no answer"
        answer = json.loads(body)
        assert answer["status"] == "success", f"{path} {params}: {answer}"
        return answer["data"]

    def query(self, promql: str) -> list[dict]:
        """The result vector of an instant query."""
        return self.api("query", query=promql)["result"]

    def by_instance(self, promql: str) -> dict[str, float]:
        return {r["metric"]["instance"]: float(r["value"][1]) for r in self.query(promql)}

    def until(self, what: str, answer, accept=bool):
        """Poll ``answer()`` until ``accept`` takes what it returns (by default, until it
        is true), at most TIMEOUT seconds; that answer."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.process.returncode}:\n{self.log.read_text()}")
            result = answer()
            if accept(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not after {TIMEOUT}s, the last answer was {result!r}")
            time.sleep(0.25)

    def until_equal(self, promql: str, expected, what: str, by=None):
        """Poll ``by(promql)`` (``by_instance`` unless given) until it equals ``expected``."""
        by = by or self.by_instance
        return self.until(f"{what}: {promql} == {expected!r}", lambda: by(promql), lambda got: got == expected)

    def wait_ready(self) -> None:
        self.until("prometheus ready", lambda: get(self.url + "/-/ready")[0] == 200)

    def firing(self, alert: str) -> list[dict]:
        """The labels of each firing alert of that name."""
        return [
            a["labels"]
            for a in self.api("alerts")["alerts"]
            if a["labels"]["alertname"] == alert and a["state"] == "firing"
        ]

    def stop(self) -> None:
        """SIGTERM by PID, a bounded wait, then SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
