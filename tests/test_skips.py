"""A test that needs a feature the machine lacks skips, but never silently in CI."""

from __future__ import annotations

import pytest

from tests.helpers import ALLOW_SKIP_ENV, skip_without


@pytest.mark.parametrize(
    ("ci", "allowed", "outcome"),
    [
        ("", "", pytest.skip.Exception),
        ("true", "", pytest.fail.Exception),
        ("true", "sandbox,browser", pytest.skip.Exception),
    ],
)
def test_a_skip_fails_in_ci_unless_the_feature_is_allowed_to_be_missing(
    ci: str, allowed: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv(ALLOW_SKIP_ENV, allowed)
    with pytest.raises(BaseException) as raised:
        skip_without("browser", "no browser here")
    assert raised.type is outcome
    if outcome is pytest.fail.Exception:
        assert str(raised.value) == f"no browser here; CI must run this test ({ALLOW_SKIP_ENV}=browser allows the skip)"
