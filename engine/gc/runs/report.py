"""The run's report for a person: one self-contained HTML page (inline style and SVG chart, no
script, nothing fetched), so it renders offline and from any copy of the namespace."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from branchwater.engine.gc.runs.files import RunSummary, SliceVolume
from branchwater.engine.gc.runs.retention import ONLY_COMMITTED, ONLY_UNCOMMITTED
from branchwater.engine.units import human_size

CHART_SLICES = 40
"""Slices shown in the chart, those reclaiming the most bytes; the table lists them all."""
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#176d2c;font-weight:600}.bad{color:#a4161a;font-weight:600}.warn{background:#fff3cd;
padding:.5em 1em;border:1px solid #e0c36b}pre{background:#f6f6f6;padding:1em;overflow:auto;
max-height:40em;font-size:12px}code{font-size:12px}.muted{color:#666}
"""
_COUNTS = (
    ("listed", "objects listed in the slices read"),
    ("young", "younger than the minimum age (left alone)"),
    ("ignored", "keys under data/ not of the address form (left alone)"),
    ("considered", "considered by this run"),
    ("new", "considered for the first time"),
    ("namespace", "in the namespace, old enough (the gate's share is of these)"),
    ("committed", "listed and committed"),
    ("uncommitted", "listed and only uncommitted"),
    ("candidates", "candidates for deletion"),
    ("deleted", "deleted"),
    ("abandoned", "abandoned writes discarded (killed uploads, a day old or more)"),
    ("pending", "kept for the next run (uncommitted only)"),
    ("carry", "committed addresses carried to the next run"),
    ("committed_addresses", "committed addresses read (new ranges)"),
    ("uncommitted_addresses", "uncommitted addresses (prepare output)"),
)


def render(summary: RunSummary, validations: dict[str, Any] | None) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>GC run {escape(summary.run_id)} — {escape(summary.repository)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title(summary))} of <code>{escape(summary.repository)}</code>, run "
        f"<code>{escape(summary.run_id)}</code></h1>",
        _verdict(summary),
        _notices(summary),
        "<h2>Run</h2>",
        _table(_run_rows(summary)),
        "<h2>Counts</h2>",
        _counts(summary),
        "<h2>Reclaimed bytes per slice</h2>",
        _chart(summary.reclaimed_by_slice),
        _slice_table(summary.reclaimed_by_slice),
        "<h2>Retention: objects only expired commits held</h2>",
        _retention(summary.retention),
        "<h2>Quality gate</h2>",
        _gate(summary),
        "<h2>Phases</h2>",
        _table([(name, f"{seconds:.2f} s") for name, seconds in summary.phases.items()]),
        "<h2>Great Expectations validation results</h2>",
        "<details><summary>as GX reported them</summary><pre>",
        escape(json.dumps(validations, indent=1, sort_keys=True, default=str)),
        "</pre></details>",
        "</body></html>",
    ]
    return "\n".join(parts)


TITLES = {
    (ONLY_UNCOMMITTED,): "Uncommitted GC",
    (ONLY_COMMITTED,): "Committed GC (retention)",
    (ONLY_UNCOMMITTED, ONLY_COMMITTED): "Uncommitted and committed GC (retention)",
}
"""The report's title by the parts the run did: a committed-only run collected nothing
uncommitted, so it must not read as an uncommitted run."""


def parts_done(summary: RunSummary) -> list[str]:
    """The parts the run did; a summary saved before retention existed did the uncommitted
    one. A committed-only run of a repository without rules did none."""
    return list(summary.retention.get("parts", [ONLY_UNCOMMITTED]))


def title(summary: RunSummary) -> str:
    return TITLES.get(tuple(parts_done(summary)), "GC (no part ran)")


def _verdict(summary: RunSummary) -> str:
    text = {
        "swept": "Swept: the candidates were deleted.",
        "marked": "Marked: the gate passed; nothing deleted yet"
        + (" (dry run)." if summary.dry_run else "."),
        "gate_failed": "The quality gate failed: nothing was deleted.",
        "failed": "The run failed: nothing was deleted.",
    }.get(summary.status, summary.status)
    css = "bad" if summary.status in ("gate_failed", "failed") else "ok"
    error = f"<p><code>{escape(summary.error)}</code></p>" if summary.error else ""
    return f'<p class="{css}">{escape(text)}</p>{error}'


def _notices(summary: RunSummary) -> str:
    notices = []
    if summary.min_age_override:
        notices.append(
            f"Minimum age overridden: {summary.min_age_seconds:g} s instead of the lake's "
            f"{summary.default_min_age_seconds:g} s. Objects uploaded under a live link token "
            "may have been collected."
        )
    if summary.fallback:
        notices.append(summary.fallback)
    return "".join(f'<p class="warn">{escape(n)}</p>' for n in notices)


def _run_rows(summary: RunSummary) -> list[tuple[str, str]]:
    slices = summary.slices
    return [
        ("repository", f"{summary.repository} ({summary.storage_namespace})"),
        ("mode", summary.mode + ("" if summary.mode == summary.requested_mode else " (fallback)")),
        ("parts", ", ".join(parts_done(summary)) or "none"),
        ("base run", summary.base_run or "none"),
        ("started", summary.started_at),
        ("prepare started", summary.prepare_started_at),
        ("cutoff", summary.cutoff),
        ("minimum age", f"{summary.min_age_seconds:g} s"),
        ("considered after", summary.considered_after or "(everything)"),
        ("considered through", summary.considered_through or ""),
        (
            "slices read",
            f"{slices.get('read', 0)} (newest {slices.get('newest_read')}, oldest "
            f"{slices.get('oldest_read')}); skipped {slices.get('skipped_young', 0)} too young, "
            f"{slices.get('skipped_old', 0)} swept before",
        ),
        ("marked on", f"the {slices.get('marked_on', 'executors')}"),
        (
            "ranges read",
            f"{summary.ranges.get('ranges_read', 0)} ranges of "
            f"{summary.ranges.get('metaranges_read', 0)} new metaranges",
        ),
        ("swept", summary.swept_at or "no"),
        ("summary", summary.summary_uri),
    ]


def _counts(summary: RunSummary) -> str:
    rows = [
        f"<tr><td>{escape(label)}</td><td class=n>{summary.volume(name).objects:,}</td>"
        f"<td class=n>{human_size(summary.volume(name).bytes)}</td></tr>"
        for name, label in _COUNTS
        if name in summary.counts
    ]
    return "<table><tr><th></th><th>objects</th><th>bytes</th></tr>" + "".join(rows) + "</table>"


def _chart(volumes: list[SliceVolume]) -> str:
    """A horizontal bar chart as inline SVG."""
    shown = sorted(volumes, key=lambda v: v.bytes, reverse=True)[:CHART_SLICES]
    if not shown:
        return "<p>Nothing reclaimed.</p>"
    largest = max(v.bytes for v in shown) or 1
    bar, label, width, gap = 18, 190, 460, 6
    height = len(shown) * (bar + gap)
    rows = []
    for i, volume in enumerate(shown):
        y = i * (bar + gap)
        length = max(1.0, width * volume.bytes / largest)
        rows.append(
            f'<text x="0" y="{y + 13}" font-size="12" font-family="monospace">'
            f"{escape(volume.slice)}</text>"
            f'<rect x="{label}" y="{y}" width="{length:.1f}" height="{bar}" fill="#3b7dd8">'
            f"<title>{volume.objects:,} objects, {human_size(volume.bytes)}</title></rect>"
            f'<text x="{label + length + 6:.1f}" y="{y + 13}" font-size="12">'
            f"{human_size(volume.bytes)}</text>"
        )
    total = label + width + 110
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height}" '
        f'role="img" aria-label="reclaimed bytes per slice">{"".join(rows)}</svg>'
    )


def _retention(retention: dict[str, Any]) -> str:
    """The committed part: its rules, commit counts, and what it reclaims per branch and per
    month of commit date (the newest expired commit holding each object)."""
    if not retention.get("rules"):
        return "<p>No retention rules: every commit's objects are kept.</p>"
    candidates = retention.get("candidates", {})
    rows = [
        ("parts", ", ".join(retention.get("parts", []))),
        ("rules", json.dumps(retention["rules"], sort_keys=True)),
        ("measured at", retention.get("now", "")),
        ("active commits", f"{retention.get('active_commits', 0):,}"),
        ("expired commits", f"{retention.get('expired_commits', 0):,}"),
        (
            "candidates",
            f"{candidates.get('objects', 0):,} objects, {human_size(candidates.get('bytes', 0))}",
        ),
        ("dropped by the re-check", f"{retention.get('dropped_by_recheck', 0):,}"),
        ("left as possibly too young", f"{retention.get('too_young', 0):,}"),
    ]
    parts = [_table(rows)]
    for key, title in (("by_branch", "per branch"), ("by_month", "per month of commit date")):
        volumes = [
            SliceVolume(name, v["objects"], v["bytes"])
            for name, v in sorted(retention.get(key, {}).items())
        ]
        parts += [f"<h3>Reclaimed bytes {title}</h3>", _chart(volumes)]
    shown = retention.get("expired_shown", [])
    if shown:
        parts.append("<details><summary>expired commits (newest shown)</summary>")
        parts.append(_table([(c["commit"][:12], f"{c['date']} on {c['branch']}") for c in shown]))
        parts.append("</details>")
    return "".join(parts)


def _slice_table(volumes: list[SliceVolume]) -> str:
    if not volumes:
        return ""
    return _table(
        [(v.slice, f"{v.objects:,} objects, {human_size(v.bytes)}") for v in volumes],
        header=("slice", "reclaimed"),
    )


def _gate(summary: RunSummary) -> str:
    if summary.gate_success is None:
        return "<p>The gate did not run.</p>"
    verdict = "passed" if summary.gate_success else "failed"
    rows = [
        f"<tr><td>{escape(e.suite)}</td><td><code>{escape(e.type)}</code><br><code>"
        f"{escape(json.dumps(e.kwargs, sort_keys=True))}</code></td>"
        f'<td class="{"ok" if e.success else "bad"}">{"pass" if e.success else "FAIL"}</td>'
        f"<td>{_figures(e.observed)}</td>"
        "</tr>"
        for e in summary.gate
    ]
    return (
        f'<p class="{"ok" if summary.gate_success else "bad"}">The gate {verdict}.</p>'
        "<table><tr><th>suite</th><th>expectation</th><th>result</th><th>GX figures</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _figures(observed: dict[str, object]) -> str:
    """GX's figures, which a suite that passed does not keep (see `gate.PASSING_FORMAT`)."""
    if not observed:
        return '<span class="muted">none kept for a suite that passed</span>'
    return f"<code>{escape(json.dumps(observed, sort_keys=True, default=str))}</code>"


def _table(rows: list[tuple[str, str]], header: tuple[str, str] | None = None) -> str:
    head = f"<tr><th>{escape(header[0])}</th><th>{escape(header[1])}</th></tr>" if header else ""
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{head}{body}</table>"
