"""The ``peak-qps`` chart says what the search found: the figure it plots is the p99 of
LoadGen's server rule, a peak is claimed only for a bracketed search (as ``server.peak_qps``
is), and an INVALID probe is drawn as a failure even with its p99 within the bound.

Named ``test_peak_chart.py`` (tests/README.md): test_peak.py is tasks/run/scenarios/peak.py's (pytest
needs unique basenames)."""

from __future__ import annotations

from dashboards.peak import FAILED, PASSED, peak_qps_figure
from tasks.run.scenarios.peak import PeakResult, Probe

LATE = "latency.issue_lateness_ms.p99 9.00 > 5% of run.request.latency_bound_ms 100.0"


def _title(res: PeakResult) -> str:
    return str(peak_qps_figure(res).layout.title.text)


def test_a_peak_is_claimed_only_for_a_bracketed_search():
    bracketed = PeakResult(100.0, [Probe(20.0, 50.0, True), Probe(40.0, 300.0, False)], low=20.0, high=40.0)
    assert _title(bracketed).endswith(": peak 20 QPS (bracket 20..40)")
    every_passed = PeakResult(100.0, [Probe(20.0, 50.0, True), Probe(40.0, 60.0, True)], low=40.0)
    assert _title(every_passed).endswith(": no peak found: every probe passed, up to 40 QPS (a lower bound)")
    assert "peak 40" not in _title(every_passed)
    none_passed = PeakResult(100.0, [Probe(20.0, 300.0, False), Probe(10.0, 290.0, False)], high=10.0)
    assert _title(none_passed).endswith(": no probe passed: the peak, if any, is below 10 QPS")


def test_the_plotted_figure_is_named_as_the_server_rule_p99_not_the_estimate():
    fig = peak_qps_figure(PeakResult(100.0, [Probe(20.0, 50.0, True)], low=20.0))
    text = f"{fig.layout.title.text} {fig.layout.yaxis.title.text}".lower()
    assert "server rule" in text and "early-stopping" not in text and "early stopping" not in text
    html = fig.to_html(include_plotlyjs=False, full_html=True)
    assert "Peak-QPS search: p99 under LoadGen's server rule against Poisson rate: no peak found" in html


def test_an_invalid_probe_within_the_bound_is_drawn_as_a_failure_with_its_reason():
    res = PeakResult(
        100.0,
        [
            Probe(20.0, 50.0, True, run_id="a", validity="VALID"),
            Probe(40.0, 60.0, False, run_id="b", validity="INVALID", reasons=(LATE,)),
        ],
        low=20.0,
        high=40.0,
    )
    by_name = {t.name: t for t in peak_qps_figure(res).data if t.name}
    assert list(by_name[PASSED].x) == [20.0] and list(by_name[FAILED].x) == [40.0]
    assert list(by_name[FAILED].y) == [60.0]  # below the bound, yet failed: the legend says why it can be
    assert by_name[FAILED].text[0] == f"run b; INVALID; {LATE}"


def test_a_lower_bound_with_failures_for_other_reasons_does_not_say_every_probe_passed():
    busy = Probe(40.0, 12.0, False, validity="INVALID", reasons=(LATE,))
    res = PeakResult(100.0, [Probe(20.0, 50.0, True), busy, Probe(38.0, 50.0, True)], low=38.0)
    assert _title(res).endswith(": no peak found: no probe missed the bound, up to 38 QPS (a lower bound)")
    only_busy = PeakResult(100.0, [busy, Probe(20.0, 11.0, False, validity="INVALID", reasons=(LATE,))])
    assert _title(only_busy).endswith(": no probe passed, none missed the bound: each failed for another reason")
