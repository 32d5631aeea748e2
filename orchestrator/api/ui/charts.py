"""Server-rendered SVG of a budget's burn-up: cumulative actual spend, the forecast to the
window's end at the current burn, the limit, and the grade thresholds as bands. No script, no
external asset. The SVG has a ``<title>`` and ``<desc>``; every figure is also in the page's
table, which is what a screen reader reads."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from html import escape

from orchestrator.api.ui.views import BudgetView

WIDTH, HEIGHT, PAD = 640, 240, 40
BAND_COLOURS = {"warn": "#fff3c4", "spot-only": "#ffe0b2", "no-new-launches": "#ffcdd2",
                "drain": "#f8bbd0"}


def burn_up(view: BudgetView) -> str:
    status = view.status
    start, end = status.window_start, status.window_end
    top = max(float(status.limit_usd) * 1.15, float(status.forecast_usd) * 1.05,
              float(status.spent_usd) * 1.05, 1.0)
    span = max((end - start).total_seconds(), 1.0)

    def x(moment: datetime) -> float:
        return PAD + (WIDTH - 2 * PAD) * min(max((moment - start).total_seconds() / span, 0), 1)

    def y(usd: float | Decimal) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * min(float(usd) / top, 1.0)

    limit = float(status.limit_usd)
    parts = [f'<svg class="burnup" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-labelledby="t-{escape(status.budget)} d-{escape(status.budget)}" '
             'xmlns="http://www.w3.org/2000/svg">',
             f'<title id="t-{escape(status.budget)}">Burn-up of budget {escape(status.key)}</title>',
             f'<desc id="d-{escape(status.budget)}">Spent ${status.spent_usd:,.2f} of '
             f'${status.limit_usd:,.2f}; forecast ${status.forecast_usd:,.2f} at the window end.'
             '</desc>']
    bounds = sorted(view.bands)
    for i, (at, action) in enumerate(bounds):
        upper = bounds[i + 1][0] if i + 1 < len(bounds) else 100 * top / max(limit, 1e-9)
        low, high = y(limit * at / 100), y(limit * min(upper, 1000) / 100)
        if low - high > 0.5:
            parts.append(f'<rect x="{PAD}" y="{high:.1f}" width="{WIDTH - 2 * PAD}" '
                         f'height="{low - high:.1f}" fill="{BAND_COLOURS.get(action, "#eee")}">'
                         f'<title>{escape(action)} from {at:g}%</title></rect>')
    parts.append(f'<line class="axis" x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" '
                 f'y2="{HEIGHT - PAD}" stroke="#333"/>')
    parts.append(f'<line class="limit" x1="{PAD}" y1="{y(limit):.1f}" x2="{WIDTH - PAD}" '
                 f'y2="{y(limit):.1f}" stroke="#b00020" stroke-width="2"/>')
    parts.append(f'<text x="{WIDTH - PAD}" y="{y(limit) - 4:.1f}" text-anchor="end" '
                 f'font-size="12" fill="#b00020">limit ${limit:,.0f}</text>')
    points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in view.actual)
    parts.append(f'<polyline class="actual" points="{points}" fill="none" stroke="#0b5394" '
                 'stroke-width="3"/>')
    if view.actual:
        now, spent = view.actual[-1]
        parts.append(f'<line class="forecast" x1="{x(now):.1f}" y1="{y(spent):.1f}" '
                     f'x2="{x(end):.1f}" y2="{y(status.forecast_usd):.1f}" stroke="#0b5394" '
                     'stroke-dasharray="6 4" stroke-width="2"/>')
    parts.append(f'<text x="{PAD}" y="{HEIGHT - PAD + 16}" font-size="12">'
                 f'{start:%Y-%m-%d %H:%M}</text>')
    parts.append(f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 16}" font-size="12" '
                 f'text-anchor="end">{end:%Y-%m-%d %H:%M} UTC</text>')
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["burn_up"]
