import pytest

from couplet.writing.calendar import BRANCHES, DEFAULT_YEAR, STEMS, ZODIAC, ganzhi, year_label, zodiac


@pytest.mark.parametrize(("year", "gz", "animal"), [
    (2025, "乙巳", "蛇"), (2026, "丙午", "马"), (2027, "丁未", "羊"), (1984, "甲子", "鼠"),
    (2000, "庚辰", "龙"), (1900, "庚子", "鼠"), (2100, "庚申", "猴"),
])
def test_known_years(year, gz, animal):
    assert ganzhi(year) == gz
    assert zodiac(year) == animal
    assert year_label(year) == f"{gz}{animal}年"


def test_default_is_the_horse():
    assert DEFAULT_YEAR == 2026
    assert year_label(DEFAULT_YEAR) == "丙午马年"


def test_sixty_year_cycle():
    labels = [year_label(y) for y in range(1924, 1984)]
    assert len(set(labels)) == 60  # every pair of the cycle exactly once
    for y in range(1900, 2041):
        assert year_label(y) == year_label(y + 60)
        assert ganzhi(y)[0] == STEMS[(y - 4) % 10]
        assert zodiac(y) == ZODIAC[BRANCHES.index(ganzhi(y)[1])]


@pytest.mark.parametrize("bad", [1899, 2101, -4, 2026.0, "2026", True])
def test_rejects_bad_years_in_both_languages(bad):
    with pytest.raises(ValueError, match="年份.*year"):
        year_label(bad)
