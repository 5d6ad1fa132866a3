"""The one process runner: what every command the pipeline runs gets from it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gitrepos import GIT_ENV, make_repo
from xla_host import log, runner
from xla_host.errors import ExitCode, PipelineError


def test_a_command_past_its_timeout_stops_with_an_error_naming_the_step_and_a_fix() -> None:
    with pytest.raises(runner.StepTimedOut) as caught:
        runner.run(
            [sys.executable, "-c", "import time; time.sleep(30)"],
            step="resolving the runtime wheels",
            timeout=0.5,
            timeout_fix="check that the package index is reachable",
        )
    error = caught.value
    assert isinstance(error, PipelineError) and error.exit_code == 8
    assert error.message == "resolving the runtime wheels did not finish within 0.5s"
    assert error.fix == "check that the package index is reachable"


@pytest.mark.slow
def test_a_captured_command_past_its_timeout_keeps_what_it_printed_before() -> None:
    # The series checks read the verdicts a hung check program printed before it hung.
    script = "import time; print('PASS first', flush=True); time.sleep(30)"
    with pytest.raises(runner.StepTimedOut) as caught:
        runner.run([sys.executable, "-c", script], echo="none", timeout=2)
    assert caught.value.output == "PASS first\n"


def test_output_that_is_not_utf8_is_read_with_replacement_characters() -> None:
    script = "import sys; sys.stdout.buffer.write(b'frame \\xff end')"
    result = runner.run([sys.executable, "-c", script], echo="none")
    assert result.stdout == "frame \ufffd end"


def test_a_streamed_command_past_its_timeout_stops_too() -> None:
    with pytest.raises(runner.StepTimedOut, match="git-like did not finish"):
        runner.run(
            [sys.executable, "-c", "import sys, time; sys.stderr.write('1%\\r'); time.sleep(30)"],
            step="git-like",
            output="stream-stderr",
            timeout=0.5,
        )


def test_gits_location_variables_of_a_hook_never_reach_the_child(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    make_repo(ours, {"a": "a\n"})
    hook = tmp_path / "hook"
    make_repo(hook, {"b": "b\n"})
    hook_env = {
        **GIT_ENV,
        "GIT_DIR": str(hook / ".git"),
        "GIT_WORK_TREE": str(hook),
        "GIT_INDEX_FILE": str(hook / ".git" / "index"),
    }
    result = runner.run(
        ["git", "rev-parse", "--absolute-git-dir"], cwd=ours, base_env=hook_env, echo="none"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(ours / ".git")


def test_the_printed_line_the_output_and_the_stage_log_are_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def redact(text: str) -> str:
        return text.replace("s3cret", "<redacted>")

    with log.stage_log(tmp_path / "stage.log"):
        result = runner.run(
            [
                sys.executable,
                "-c",
                "import sys; print(sys.argv[1]); print('err', file=sys.stderr)",
                "s3cret",
            ],
            redact=redact,
        )
    assert result.stdout == "<redacted>\n" and result.stderr == "err\n"
    printed = capsys.readouterr().err
    stage_log = (tmp_path / "stage.log").read_text()
    for text in (printed, stage_log):
        assert "s3cret" not in text and "<redacted>" in text
    assert "err" in stage_log


def test_streaming_passes_stderr_on_and_keeps_the_last_state_of_each_meter_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    result = runner.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.stderr.write('10%\\r50%\\r100%\\ndone\\n'); print('out')",
        ],
        output="stream-stderr",
        echo="none",
    )
    assert (result.stdout, result.stderr) == ("out\n", "100%\ndone")
    assert "10%\r50%\r100%" in capfd.readouterr().err


def test_output_to_a_file_gets_stdout_and_stderr(tmp_path: Path) -> None:
    with (tmp_path / "out.log").open("w") as handle:
        result = runner.run(
            [sys.executable, "-c", "import sys; print('o'); print('e', file=sys.stderr)"],
            output=handle,
            echo="none",
        )
    assert result.returncode == 0
    assert sorted((tmp_path / "out.log").read_text().split()) == ["e", "o"]


def test_a_teed_step_reaches_its_log_and_stderr_redacted_line_by_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = "import sys; print('token=s3cret'); print('warn', file=sys.stderr); sys.exit(3)"
    with (tmp_path / "step.log").open("w") as step_log:
        result = runner.run(
            [sys.executable, "-c", script],
            echo="none",
            tee=step_log,
            redact=lambda text: text.replace("s3cret", "<redacted>"),
            check=False,
        )
    assert result.returncode == 3
    assert (tmp_path / "step.log").read_text().split() == ["token=<redacted>", "warn"]
    streamed = capfd.readouterr().err
    assert "token=<redacted>" in streamed and "s3cret" not in streamed


def test_a_teed_step_past_its_timeout_is_killed(tmp_path: Path) -> None:
    with (tmp_path / "step.log").open("w") as step_log, pytest.raises(runner.StepTimedOut):
        runner.run(
            [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"],
            step="torch wheel",
            echo="none",
            tee=step_log,
            timeout=0.5,
        )
    assert (tmp_path / "step.log").read_text() == "started\n"


def test_stop_ends_a_process_and_kills_one_that_ignores_sigterm() -> None:
    # Each would sleep an hour: how each ended (its signal) says what stop did to it.
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    stubborn = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('ready', flush=True); time.sleep(3600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
    runner.stop(polite, grace_s=5)
    runner.stop(stubborn, grace_s=1)
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL  # after its grace, not the sleep's hour


FAILING = "import sys; print('out'); sys.stderr.write(''.join(f'line {i}\\n' for i in range(40)))"


def test_a_failed_command_raises_naming_it_and_the_tail_of_its_stderr() -> None:
    argv = [sys.executable, "-c", f"{FAILING}; sys.exit(4)"]
    with pytest.raises(runner.CommandFailed) as caught:
        runner.run(argv, env={"INDEX": "https://user:tok3n@example.invalid/simple"},
                   shown_env={"INDEX": "https://user:tok3n@example.invalid/simple"},
                   echo="none", fix="do the thing")  # fmt: skip
    failed = caught.value
    assert failed.exit_code == 1 and failed.returncode == 4
    first, *tail = failed.message.splitlines()
    assert first.startswith("`INDEX=https://") and first.endswith(" failed (exit 4):")
    assert "tok3n" not in failed.message  # the command is shown masked
    assert tail == [f"line {i}" for i in range(25, 40)]  # the last 15 lines, not stdout
    assert failed.fix == "do the thing"
    assert failed.result.stdout == "out\n"


def test_a_caller_that_judges_the_code_itself_asks_not_to_be_raised_at() -> None:
    result = runner.run([sys.executable, "-c", f"{FAILING}; sys.exit(4)"], echo="none", check=False)
    assert result.returncode == 4
    assert runner.run([sys.executable, "-c", "pass"], echo="none").returncode == 0


def test_a_step_whose_failure_has_its_own_error_raises_that_error_made_from_the_result() -> None:
    class Refused(PipelineError):
        exit_code = ExitCode.BAD_INPUT

    def refused(result: subprocess.CompletedProcess[str]) -> PipelineError:
        return Refused(f"the tool said {result.stdout.strip()!r} (exit {result.returncode})")

    argv = [sys.executable, "-c", f"{FAILING}; sys.exit(4)"]
    with pytest.raises(Refused, match=r"the tool said 'out' \(exit 4\)") as caught:
        runner.run(argv, echo="none", error=refused)
    assert caught.value.exit_code == 2
    # A command that succeeds never calls it.
    assert runner.run([sys.executable, "-c", "pass"], echo="none", error=refused).returncode == 0


def test_a_failed_git_command_raises_git_error_or_the_callers_own(tmp_path: Path) -> None:
    """run_git lets the runner raise: git's stderr whole in a GitError, a step's own error
    when it gives one, the result only when asked not to check."""
    from xla_host.errors import GitError
    from xla_wheels.gitutil import compose, run_git

    missing = compose(["rev-parse", "--verify", "no-such-ref"], cwd=tmp_path)
    with pytest.raises(GitError) as caught:
        run_git(missing)
    assert "git rev-parse --verify no-such-ref failed (exit" in caught.value.message
    assert "not a git repository" in caught.value.message  # git's own stderr
    with pytest.raises(PipelineError) as own:
        run_git(missing, error=lambda result: PipelineError(f"own {result.returncode}", fix="x"))
    assert own.value.message.startswith("own ") and not isinstance(own.value, GitError)
    assert run_git(missing, check=False).returncode != 0
