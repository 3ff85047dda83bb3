"""Structured logging: one JSON object per line on stderr, easy to grep and to ship.

Fields: ts (RFC 3339, UTC), level, logger, msg, plus any `extra={...}` given at the call site
(uid, policy, mode, decision, cache, ...). Exceptions are logged with their traceback in the
"exc" field, never sent to clients. No certificate or key material is ever passed to a logger.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Format a LogRecord as one JSON line with its `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "info") -> None:
    """Send dra_guard.* loggers to stderr as JSON lines at `level` (debug, info, warning, error)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("dra_guard")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
