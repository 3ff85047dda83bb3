"""ServerLogger: no per-request access-log work while gunicorn.access is off."""

from __future__ import annotations

import logging

from gunicorn.config import Config

from webhook.serve.worker import ServerLogger


def make_logger(access_level: str) -> ServerLogger:
    cfg = Config()
    cfg.set(
        "logconfig_dict",
        {
            "version": 1,
            "disable_existing_loggers": False,
            "loggers": {"gunicorn.access": {"level": access_level, "handlers": [], "propagate": False}},
        },
    )
    return ServerLogger(cfg)


def test_access_log_off_builds_no_atoms(monkeypatch):
    logger = make_logger("WARNING")
    assert logger.access_log_enabled  # what gunicorn itself concludes from a logconfig: the reason for the class

    def atoms(*_args):
        raise AssertionError("access-log atoms built although gunicorn.access logs nothing")

    monkeypatch.setattr(logger, "atoms", atoms)
    logger.access(object(), object(), {}, 0.001)


def test_access_log_on_still_logs(monkeypatch):
    logger = make_logger("INFO")
    seen = []
    monkeypatch.setattr(logger, "atoms", lambda *args: seen.append(args) or {"h": "127.0.0.1"})
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("gunicorn.access").addHandler(handler)
    try:
        logger.access(object(), object(), {}, 0.001)
    finally:
        logging.getLogger("gunicorn.access").removeHandler(handler)
    assert seen and records


def test_client_timeout_is_one_warning_line_and_counted(caplog):
    from prometheus_client import REGISTRY

    logger = make_logger("WARNING")
    before = REGISTRY.get_sample_value("dra_guard_client_timeouts_total") or 0
    try:
        raise TimeoutError("The read operation timed out")
    except TimeoutError:
        with caplog.at_level(logging.WARNING, logger="gunicorn.error"):
            logger.exception("Socket error processing request.")
    records = [r for r in caplog.records if r.name == "gunicorn.error"]
    assert [r.levelname for r in records] == ["WARNING"] and records[0].exc_info is None
    assert "client timed out" in records[0].getMessage()
    assert REGISTRY.get_sample_value("dra_guard_client_timeouts_total") == before + 1


def test_other_socket_errors_keep_their_traceback(caplog):
    logger = make_logger("WARNING")
    try:
        raise OSError(99, "something else")
    except OSError:
        with caplog.at_level(logging.ERROR, logger="gunicorn.error"):
            logger.exception("Socket error processing request.")
    records = [r for r in caplog.records if r.name == "gunicorn.error"]
    assert records and records[0].levelname == "ERROR" and records[0].exc_info is not None
