"""The CLI's argument types refuse bad values with a usage error naming them (recmesh.tools.cli.common)."""

from __future__ import annotations

import pytest

from recmesh.tools.cli.main import build_parser


def test_repeat_and_waits_are_parsed() -> None:
    args = build_parser().parse_args(["bench", "inference", "--repeat", "3", "--max-delay-us", "0,500"])
    assert (args.repeat, args.max_delay_us) == (3, [0, 500])


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bench", "e2e", "--repeat", "0"], "--repeat: must be at least 1, not 0"),
        (["bench", "features", "--repeat", "two"], "--repeat: 'two' is not a whole number"),
        (["bench", "inference", "--max-delay-us", "abc"], "'abc' is not a comma-separated list"),
        (["bench", "inference", "--max-delay-us", "0,-5"], "every value must be >= 0"),
    ],
)
def test_bad_values_are_usage_errors_naming_them(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
