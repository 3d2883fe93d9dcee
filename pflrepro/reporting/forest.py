"""One figure per paper that says at a glance how its claims fared: a forest plot (issue 51).

One row per claim that was evaluated (headline claims first, marked ★): the claimed region shaded green with its
boundary dashed, the reproduced effect (its point and 90 % interval, the one the verdict read) coloured by the
verdict, each cell's own interval in grey beneath it, and the paper's own effect on its printed numbers as a black
diamond. Every row has its own x axis, in the claim's units (points of accuracy, a ratio, rounds): claims about
different quantities are not put on one scale. The verdict is written at the right, with what qualifies it
(metric-sensitive; the paper's own numbers contradicting the sentence; a by-design quantity that fails).
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"holds": "#2e7d32", "partial": "#7cb342", "fails": "#c62828", "inconclusive": "#f9a825",
           "underpowered": "#9e9e9e", "by design": "#5c6bc0", "not run": "#bdbdbd"}
REGION = "#c8e6c9"
ROW_HEIGHT = 0.46      # inches per claim


def plotted(rows: list[dict]) -> list[dict]:
    """The claims a forest plot shows, in order: those with an effect (headline claims first, then by stage)."""
    have = [r for r in rows if r.get("effect") is not None and r["verdict"] != "not run"]
    return sorted(have, key=lambda r: (not r.get("headline"), r["stage"], r["id"]))


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and x == x and math.isfinite(float(x))]


def _limits(r: dict) -> tuple[float, float]:
    pts = _finite([r["effect"], *(r.get("ci") or []), r.get("paper_effect"), *r.get("bounds", [])])
    for _, c in r.get("cell_ci", []):
        pts += _finite(c or [])
    if not pts:
        return -1.0, 1.0
    lo, hi = min(pts), max(pts)
    pad = 0.12 * (hi - lo) if hi > lo else max(0.5, 0.1 * abs(lo))
    return lo - pad, hi + pad


def _shade(ax, spec: dict, lo: float, hi: float) -> None:
    """The claimed region over [lo, hi] and its boundary."""
    op = spec.get("op")
    if op == "band":
        a, b = max(spec["lo"], lo), min(spec["hi"], hi)
        if spec.get("null") is not None:
            a, b = (max(a, spec["null"]), b) if spec.get("above") else (a, min(b, spec["null"]))
        edges = [x for x in (spec["lo"], spec["hi"]) if math.isfinite(x)]
    elif op in (">", ">="):
        a, b, edges = max(spec["t"], lo), hi, [spec["t"]]
    else:
        a, b, edges = lo, min(spec["t"], hi), [spec["t"]]
    if b > a:
        ax.axvspan(a, b, color=REGION, zorder=0, lw=0)
    for e in edges:
        if lo <= e <= hi:
            ax.axvline(e, color="#2e7d32", ls="--", lw=0.8, zorder=1)


def _interval(ax, ci, y: float, lo: float, hi: float, **kw) -> None:
    a, b = ci
    a_c, b_c = max(a if a == a else lo, lo), min(b if b == b else hi, hi)
    ax.plot([a_c, b_c], [y, y], solid_capstyle="butt", **kw)
    for end, clipped, mark in ((a, a_c, "<"), (b, b_c, ">")):
        if not (end == end and lo <= end <= hi):
            ax.plot([clipped], [y], marker=mark, color=kw.get("color"), ms=4, zorder=kw.get("zorder", 3))


def _qualifiers(r: dict) -> str:
    q = []
    if r.get("metric_sensitive"):
        q.append(f"metric-sensitive (last tenth: {r.get('robust_verdict')})")
    if r.get("kernel_sensitive"):
        q.append(f"kernel-sensitive ({r['kernel']['verdict']} on the other path)")
    if r.get("paper_check"):
        q.append("paper's numbers disagree")
    if r["verdict"] == "by design" and r.get("quantity_verdict"):
        q.append(f"quantity {r['quantity_verdict']}")
    return "; ".join(q)


def figure(rows: list[dict], title: str):
    """The forest plot of one paper's claims (module docstring); None when none has an effect."""
    rows = plotted(rows)
    if not rows:
        return None
    n, axis_h, gap, top, bottom = len(rows), 0.17, ROW_HEIGHT - 0.17, 0.85, 0.3
    height = top + n * axis_h + (n - 1) * gap + bottom
    fig, axes = plt.subplots(n, 1, figsize=(11.0, height), squeeze=False)
    fig.subplots_adjust(left=0.27, right=0.7, top=1 - top / height, bottom=bottom / height, hspace=gap / axis_h)
    for ax, r in zip(axes[:, 0], rows):
        lo, hi = _limits(r)
        ax.set_xlim(lo, hi)
        ax.set_ylim(-1.0, 1.0)
        _shade(ax, r.get("region_spec") or {}, lo, hi)
        colour = COLOURS.get(r["verdict"], "#444444")
        cells = [c for _, c in r.get("cell_ci", []) if c is not None]
        for i, c in enumerate(cells if len(cells) > 1 else []):
            _interval(ax, c, -0.45 - 0.35 * i / max(len(cells) - 1, 1), lo, hi, color="#9e9e9e", lw=0.8, zorder=2)
        if r.get("ci"):
            _interval(ax, r["ci"], 0.25, lo, hi, color=colour, lw=3.2, zorder=3)
        if r["effect"] == r["effect"] and math.isfinite(r["effect"]):
            ax.plot([r["effect"]], [0.25], "o", color=colour, ms=5, zorder=4, mec="white", mew=0.6)
        pe = r.get("paper_effect")
        if pe is not None and pe == pe and math.isfinite(pe) and lo <= pe <= hi:
            ax.plot([pe], [0.25], "D", mfc="none", mec="black", ms=5.5, zorder=5)
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=7, length=2, pad=1)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        name = ("★ " if r.get("headline") else "") + r["id"]
        ax.text(-0.015, 0.2, name, transform=ax.transAxes, ha="right", va="center", fontsize=8,
                fontweight="bold" if r.get("headline") else "normal")
        ax.text(-0.015, -0.55, f"{r['stage']}: {r.get('region', '')}", transform=ax.transAxes, ha="right",
                va="center", fontsize=6.5, color="#666666")
        ax.text(1.02, 0.2, r["verdict"], transform=ax.transAxes, ha="left", va="center", fontsize=8.5,
                color=colour, fontweight="bold")
        extra = _qualifiers(r)
        if extra:
            ax.text(1.02, -0.55, extra, transform=ax.transAxes, ha="left", va="center", fontsize=6.5, color="#444444")
    fig.text(0.02, 1 - 0.2 / height, f"{title}: its claims at a glance", fontsize=10, fontweight="bold", va="top")
    fig.text(0.02, 1 - 0.4 / height, "each claim's effect and 90 % interval, coloured by its verdict, against the "
             "claimed region (green, boundary dashed); ◇ the paper's own effect on its printed numbers;\ngrey: each "
             "cell's own interval; each claim has its own x axis, in its units", fontsize=7.5, color="#444444",
             va="top", linespacing=1.3)
    return fig


def save(rows: list[dict], title: str, path) -> bool:
    """Write the paper's forest plot to `path` (PNG); False when it has no claim to show."""
    fig = figure(rows, title)
    if fig is None:
        return False
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True
