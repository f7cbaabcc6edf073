"""The projection's arithmetic (tasks/measure/projection.py), exact on dyadic inputs."""

from __future__ import annotations

from tasks.measure import keys as K
from tasks.measure.projection import PhaseLeft, Projection, Projections


def test_a_phase_left_is_its_batches_at_the_steady_batch_plus_its_stage_rows_at_their_rate():
    p = PhaseLeft("train", batches_left=12, seconds_per_batch=0.25, rows_left=100, seconds_per_row=0.0625)
    assert (p.compute_seconds, p.stage_seconds, p.seconds) == (3.0, 6.25, 9.25)
    requests = PhaseLeft("single_stream", schedule_seconds=60.0)
    assert requests.seconds == 60.0


def test_the_projection_is_the_seconds_so_far_plus_every_phase_left():
    train = PhaseLeft("train", batches_left=8, seconds_per_batch=0.5, rows_left=0, seconds_per_row=0.0)
    predict = PhaseLeft(
        "predict", batches_left=20, seconds_per_batch=0.5, rows_left=80, seconds_per_row=0.125, exact=False
    )
    p = Projection("train", 9.0, (train, predict))
    assert (p.remaining_seconds, p.total_seconds) == (4.0 + 20.0, 33.0)
    assert not p.exact  # one count was an estimate
    text = p.describe()
    assert text.startswith("projected 33.0 s of timed region (0.6 min): 9.0 s so far + train 4.0 s")
    assert "~20 batches x 500.0 ms" in text and "~80 rows" in text


def test_the_first_projection_is_logged_and_a_later_one_as_the_reprojection():
    first = Projection("train", 2.0, (PhaseLeft("predict", batches_left=4, seconds_per_batch=1.0),))
    later = Projection("predict", 5.0, (PhaseLeft("predict", batches_left=1, seconds_per_batch=0.5),))
    assert Projections([]).metrics() == {}
    assert Projections([first]).metrics() == {
        K.RUN_PROJECTED_SECONDS: 6.0,
        K.RUN_PROJECTED_AT_SECONDS: 2.0,
        K.RUN_PROJECTED_EXACT: 1.0,
    }
    assert Projections([first, later]).metrics()[K.RUN_REPROJECTED_SECONDS] == 5.5
