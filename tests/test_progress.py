import io

from orchestrator.progress import PhaseProgress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_first_and_last_steps_only_when_fast():
    out = io.StringIO()
    progress = PhaseProgress(out, log_every_seconds=3600)
    for step in range(1, 101):
        progress("pretrain", step, 100, 2.0)
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["1/100", "100/100"]


def test_a_terminal_redraws_one_line_in_place():
    out = FakeTerminal()
    progress = PhaseProgress(out)
    progress("pretrain", 1, 3, 4.0)
    progress("pretrain", 3, 3, 3.0)
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "step 3/3" in text and "eta" in text
