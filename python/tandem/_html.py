"""A job as HTML for notebooks: its state, progress and an inline SVG loss curve (no plotting
library). Every string from the coordinator is escaped."""

import html
import math
from typing import Optional, Sequence, Tuple

from tandem.types import JobStatus, Step

_STATE_COLOURS = {"QUEUED": "#888", "RUNNING": "#1f77b4", "SUCCEEDED": "#2ca02c",
                  "FAILED": "#d62728", "CANCELLED": "#ff7f0e"}


def _points(xy: Sequence[Tuple[float, float]], x0, x1, y0, y1, w, h, pad) -> str:
    sx = (w - 2 * pad) / (x1 - x0) if x1 > x0 else 0.0
    sy = (h - 2 * pad) / (y1 - y0) if y1 > y0 else 0.0
    return " ".join("%.1f,%.1f" % (pad + (x - x0) * sx, h - pad - (y - y0) * sy) for x, y in xy)


def loss_svg(history: Sequence[Step], width: int = 360, height: int = 160,
             max_points: int = 2000) -> str:
    """The loss (blue) and validation loss (orange dots) against the step, as an SVG element;
    an empty string without finite losses. At most `max_points` points, evenly thinned."""
    train = [(s.step, s.loss) for s in history if math.isfinite(s.loss)]
    val = [(s.step, s.val_loss) for s in history
           if s.val_loss is not None and math.isfinite(s.val_loss)]
    if not train and not val:
        return ""
    if len(train) > max_points:
        stride = len(train) / max_points
        train = [train[int(i * stride)] for i in range(max_points)] + [train[-1]]
    both = train + val
    x0, x1 = min(p[0] for p in both), max(p[0] for p in both)
    y0, y1 = min(p[1] for p in both), max(p[1] for p in both)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = 24
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
             'viewBox="0 0 %d %d" role="img" aria-label="loss curve" '
             'style="font: 10px sans-serif; background: #fff">' % (width, height, width, height),
             '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#aaa"/>'
             % (pad, height - pad, width - pad, height - pad),
             '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#aaa"/>' % (pad, pad, pad, height - pad),
             '<text x="%d" y="%d" fill="#555">%.3g</text>' % (2, pad - 4, y1),
             '<text x="%d" y="%d" fill="#555">%.3g</text>' % (2, height - pad + 12, y0),
             '<text x="%d" y="%d" fill="#555" text-anchor="end">step %d</text>'
             % (width - pad, height - 6, x1)]
    if train:
        parts.append('<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="%s"/>'
                     % _points(train, x0, x1, y0, y1, width, height, pad))
    for p in _points(val, x0, x1, y0, y1, width, height, pad).split():
        x, y = p.split(",")
        parts.append('<circle cx="%s" cy="%s" r="2.5" fill="#ff7f0e"/>' % (x, y))
    parts.append('<text x="%d" y="%d" fill="#1f77b4">loss</text>' % (width - pad - 70, pad - 4))
    if val:
        parts.append('<text x="%d" y="%d" fill="#ff7f0e">val</text>' % (width - pad - 30, pad - 4))
    parts.append("</svg>")
    return "".join(parts)


def job_html(status: JobStatus, history: Sequence[Step], error: Optional[str] = None) -> str:
    """The job's card: id, name, state (and reason), a progress bar, losses, the curve."""
    e = html.escape
    colour = _STATE_COLOURS.get(status.state, "#888")
    pct = 100.0 * status.progress
    rows = ["<b>%s</b> (%s) <span style=\"color:%s;font-weight:bold\">%s</span>"
            % (e(status.id), e(status.name), colour, e(status.state))]
    if status.reason:
        rows.append("<div style=\"color:#555\">%s</div>" % e(status.reason))
    rows.append('<div style="display:flex;align-items:center;gap:8px">'
                '<div style="width:200px;height:10px;background:#eee;border-radius:3px">'
                '<div style="width:%.1f%%;height:10px;background:%s;border-radius:3px"></div>'
                "</div><span>step %d / %d (%.0f%%)</span></div>"
                % (pct, colour, status.steps_done, status.total_steps, pct))
    figures = []
    if status.last_loss is not None:
        figures.append("loss %.4f" % status.last_loss)
    if status.last_val_loss is not None:
        figures.append("val loss %.4f" % status.last_val_loss)
    if history:
        figures.append("%.1f ms/step" % (1000.0 * history[-1].step_seconds))
        figures.append("%.0f tok/s" % history[-1].tokens_per_second)
    if figures:
        rows.append("<div>%s</div>" % e(", ".join(figures)))
    svg = loss_svg(history)
    if svg:
        rows.append(svg)
    if error:
        rows.append("<div style=\"color:#d62728\">%s</div>" % e(error))
    return '<div class="tandem-job" style="font-family:sans-serif">%s</div>' % "".join(rows)
