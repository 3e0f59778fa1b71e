import pytest

from gpuslice.policy import cards

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("card_mode", "wanted", "ok"),
    [
        ("hami-core", None, True),  # no annotation: any mode
        ("hami-core", "hami-core", True),
        ("mig", "hami-core", False),
        ("mig", "hami-core,mig", True),  # HAMi: the annotation contains the card's mode
        ("mps", "hami-core,mig", False),
    ],
    ids=["unset", "same", "other", "list-hit", "list-miss"],
)
def test_mode_matches_like_hami(card_mode: str, wanted: str | None, ok: bool) -> None:
    assert cards.mode_matches(card_mode, wanted) is ok
