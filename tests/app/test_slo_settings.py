"""The overload targets of ``bargein serve``: on by default, off with 0, from the environment too."""

from __future__ import annotations

from bargein.app.settings import parse_serve_args
from bargein.engine.config import SchedulerConfig
from bargein.session.runtime.admission import AdmissionConfig


def test_serve_turns_the_targets_on_and_the_library_leaves_them_off() -> None:
    settings = parse_serve_args([], env={})
    assert settings.engine.scheduler.target_itl_s == 0.2
    assert settings.admission.target_ttft_s == 1.5
    assert settings.admission.bulk_share == 0.8
    assert SchedulerConfig().target_itl_s == 0.0 and AdmissionConfig().target_ttft_s == 0.0


def test_flags_and_environment_set_the_targets() -> None:
    env = {"BARGEIN_TARGET_ITL_MS": "80", "BARGEIN_TARGET_TTFT_S": "1.5", "BARGEIN_BULK_SHARE": "0.5"}
    settings = parse_serve_args([], env=env)
    assert settings.engine.scheduler.target_itl_s == 0.08
    assert (settings.admission.target_ttft_s, settings.admission.bulk_share) == (1.5, 0.5)
    off = parse_serve_args(["--target-itl-ms", "0", "--target-ttft-s", "0"], env=env)
    assert off.engine.scheduler.target_itl_s == 0.0 and off.admission.target_ttft_s == 0.0
