import pytest

from trainers.schedules import ramp


@pytest.mark.parametrize("k", [0.0, 0.1, 0.33, 0.5, 0.9, 1.0])
def test_cubic_matches_zhu_gupta_closed_form(k):
    assert ramp(k, start=0.0, warmup=1.0, shape="cubic") == pytest.approx(1 - (1 - k) ** 3)


def test_start_and_warmup_shift_and_stretch_the_ramp():
    assert ramp(0.19, start=0.2, warmup=0.4) == 0.0
    assert ramp(0.4, start=0.2, warmup=0.4) == pytest.approx(0.5)
    assert ramp(0.7, start=0.2, warmup=0.4) == 1.0


def test_cosine_is_half_way_at_mid_warmup_and_one_shot_jumps():
    assert ramp(0.25, warmup=0.5, shape="cosine") == pytest.approx(0.5)
    assert ramp(0.0, shape="one_shot") == 1.0
    assert ramp(0.1, start=0.2, shape="one_shot") == 0.0


def test_unknown_shape_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        ramp(0.5, shape="exponential")
