"""Command-line plumbing shared by every entry point: one-line errors, never a traceback."""

import argparse
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from infopro.distributed import under_torchrun
from infopro.errors import InfoProError


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (argparse prints the whole usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: an integer no smaller than `minimum`, refused in one line otherwise.

    A count below its floor would not fail on its own: `--jobs 0` schedules nothing and waits
    forever, a negative staleness lets no rank ever start a batch.
    """
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the smallest allowed value, {minimum}")
        return value

    return parse


def positive(text: str) -> float:
    """An argparse `type`: a finite number above 0 (a time budget, a size).

    Why: a time budget of 0 or less would still train one epoch; NaN compares false with every
    deadline, so it would silently mean no budget at all; an infinite part size is a traceback.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number above 0")
    return value


class Terminated(BaseException):
    """SIGTERM (`kill`, `timeout`, a job scheduler) raised as an exception, as Ctrl-C raises
    KeyboardInterrupt: `finally` blocks then run, so child trainings are stopped instead of left
    running on their own, temporary files are removed and run locks released."""


def raise_terminated(signum, frame):
    """Raise Terminated, unless this process is already stopping (a Terminated or KeyboardInterrupt
    is in flight): a second SIGTERM must not cut short the `finally` blocks that stop children.

    The handler stays installed after it fires. Python prints and drops an exception raised where
    it cannot propagate (a weakref callback, such as the one ending every import), so a SIGTERM
    landing there is lost; the next one must raise again, and `stop_children` sends it.
    """
    if not isinstance(sys.exc_info()[1], (Terminated, KeyboardInterrupt)):
        raise Terminated


def ignore_terminate() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


RESEND_SECONDS = 5.0


def stop_children(children, resend_seconds: float = RESEND_SECONDS) -> None:
    """SIGTERM the children still running and wait for every one: a command stopped must not leave
    them running alone (a grid's trainings would hold their runs' locks).

    Any still running `resend_seconds` later is sent SIGTERM again: a child whose Terminated was
    dropped (see `raise_terminated`) would otherwise train on while this process waited forever.
    """
    while running := [child for child in children if child.poll() is None]:
        for child in running:
            child.terminate()
        deadline = time.monotonic() + resend_seconds
        for child in running:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def call(command: list[str], **options) -> int:
    """Run `command` to its end and return its exit code. If this process is interrupted or
    terminated meanwhile, the child gets SIGTERM (not `subprocess.run`'s SIGKILL, which would leave
    the child's own children running) and is waited for before the exception goes on."""
    with subprocess.Popen(command, **options) as child:
        try:
            return child.wait()
        except BaseException:
            stop_children([child])
            raise


def run(main: Callable[[], object]) -> None:
    """Call `main`; turn user errors, file-system refusals, Ctrl-C and SIGTERM into one line on stderr
    and a non-zero exit.

    A reader that closes the pipe early (`... --status | head`) ends the command quietly. An
    OSError is the file system saying no (a file where a folder must be, no permission, no
    space): its own message names the path, which is all the user needs.
    """
    if not under_torchrun():  # torchrun stops its ranks itself, with SIGKILL after a grace period
        signal.signal(signal.SIGTERM, raise_terminated)
    try:
        main()
    except InfoProError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        ignore_terminate()  # a parent stopping this process after Ctrl-C must not break the line below
        print("interrupted: work completed so far is kept", file=sys.stderr)
        sys.exit(130)
    except Terminated:
        ignore_terminate()  # as after Ctrl-C: the exit below is not to be cut short
        print("terminated: work completed so far is kept", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    except BrokenPipeError:
        # Point stdout at /dev/null so that the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
