"""Logging helpers shared by every part (conventions: docs/architecture.md).

Library code only calls ``logging.getLogger(__name__)`` and logs one INFO line per
decision with key=value fields in ``extra={"kv": {...}}``; ``configure`` (called once by
the CLI) renders them as text or JSON.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any


def kv(**fields: Any) -> dict[str, Any]:
    """``logger.info("inject", extra=kv(pod="ns/p", devices=2))``."""
    return {"kv": fields}


def _fmt_value(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' "=')) else text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: Mapping[str, Any] = getattr(record, "kv", {}) or {}
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = f"{ts} {record.levelname:<5} {record.name}: {record.getMessage()}"
        if fields:
            line += " " + " ".join(f"{k}={_fmt_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, "kv", {}) or {})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Install one stderr handler on the root logger. Only the CLI calls this."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
