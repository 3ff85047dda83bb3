"""QuietAccessLogger: no per-request access-log work while gunicorn.access is off (issue 9 profile)."""
from __future__ import annotations

import logging

from gunicorn.config import Config

from webhook.server import QuietAccessLogger


def make_logger(access_level: str) -> QuietAccessLogger:
    cfg = Config()
    cfg.set("logconfig_dict", {"version": 1, "disable_existing_loggers": False,
                               "loggers": {"gunicorn.access": {"level": access_level, "handlers": [], "propagate": False}}})
    return QuietAccessLogger(cfg)


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
