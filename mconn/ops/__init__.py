"""What operators run: the twistd node, its status page and metrics, telemetry files,
the ``mconn`` command and the fault proxy.

The rule: this layer may use every layer below it; nothing below imports it. The
modules, in reading order:

* ``node``: the twistd service (``twistd -n mconn ...``);
* ``node_settings``: its settings, merged with the TOML file, and their checks;
* ``node_config_file``: the settings' names and kinds, the TOML file, the errors;
* ``node_help``: ``twistd mconn --help``'s Config options, from mconn/config.py's comments;
* ``text_log``: twistd's text log of a node, Twisted's lines with cached time and formats;
* ``status``: the status page (``/``, ``/status.json``, ``/metrics``);
* ``status_page``: its HTML;
* ``metrics``: the Prometheus metrics (specs/status.md section 4);
* ``telemetry_file``: telemetry as JSON Lines in rotating files, created 0600;
* ``telemetry_record``: one event as one line (specs/telemetry.md section 2);
* ``cli``: the ``mconn`` command: keys and a node's status;
* ``faultproxy``: an in-process TCP fault proxy for loopback networks;
* ``faultproxy_link``: its links.
"""
