"""Nothing in tests/fuzz is a pytest test: the atheris harness and its helpers run by hand
(README.md). The hypothesis tests that use them live in tests/core and tests/adapter."""

collect_ignore_glob = ["*.py"]
