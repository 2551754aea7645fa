"""From scrape text to devices: parse, detect the vendor(s), run their adapters.

Decision code: no I/O, no clock. ``gpumetrics.scrape`` fetches the text.
"""

from __future__ import annotations

from collections.abc import Collection

from gpumetrics.adapters.base import GpuAdapter, adapter_class, adapter_names, get_adapter
from gpumetrics.model import DeviceMetrics, ParseResult
from gpumetrics.promtext import parse_text

__all__ = ["AUTO", "detect_vendors", "parse_metrics"]

AUTO = "auto"
# How many family names an "unknown exporter" warning quotes.
MAX_NAMES_SHOWN = 8


def _adapter_for(name: str, prefix: str | None) -> GpuAdapter:
    # In auto mode a prefix is meant for whichever detected vendor takes one.
    return get_adapter(name, prefix=prefix if adapter_class(name).prefixable else None)


def detect_vendors(metric_names: Collection[str], prefix: str | None = None) -> tuple[str, ...]:
    """Every registered vendor whose exporter families appear, in registry order."""
    return tuple(name for name in adapter_names() if _adapter_for(name, prefix).claims(metric_names))


def parse_metrics(text: str, vendor: str = AUTO, prefix: str | None = None) -> ParseResult:
    """Parse one scrape into devices. Never raises on content; bad lines are counted.

    ``vendor`` forces one adapter (``MetricsError`` if the name is unknown or it takes no
    ``prefix``); ``"auto"`` runs every adapter whose families appear, so a text holding two
    exporters' output yields both vendors' devices. Nothing recognised: no devices and a
    warning naming what was seen.
    """
    if vendor != AUTO:
        adapter_class(vendor)  # refuse an unknown name before reading anything
    parsed = parse_text(text)
    names = {s.name for s in parsed.samples}
    vendors = detect_vendors(names, prefix) if vendor == AUTO else (vendor,)
    devices: list[DeviceMetrics] = []
    unattributed = 0
    warnings: list[str] = []
    for name in vendors:
        adapter = get_adapter(name, prefix=prefix) if vendor != AUTO else _adapter_for(name, prefix)
        out = adapter.devices(parsed.samples)
        devices.extend(out.devices)
        unattributed += out.unattributed_samples
        if adapter.warning:
            warnings.append(adapter.warning)
    if not vendors:
        shown = ", ".join(sorted(names)[:MAX_NAMES_SHOWN]) or "none"
        more = f" and {len(names) - MAX_NAMES_SHOWN} more" if len(names) > MAX_NAMES_SHOWN else ""
        warnings.append(
            f"no known GPU exporter families found (families seen: {shown}{more}); "
            f"pass a vendor explicitly (known: {', '.join(adapter_names())})"
        )
    elif not devices and not any(get_adapter(n).warning for n in vendors):
        warnings.append(f"{', '.join(vendors)}: no device found in {len(parsed.samples)} sample(s)")
    return ParseResult(
        devices=tuple(devices),
        vendors=vendors,
        samples=len(parsed.samples),
        bad_lines=parsed.bad_lines,
        bad_line_examples=parsed.bad_line_examples,
        unattributed_samples=unattributed,
        warnings=tuple(warnings),
    )
