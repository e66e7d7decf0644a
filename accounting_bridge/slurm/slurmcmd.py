"""The one place that runs Slurm commands.

Every Slurm command the bridge needs (``sacct``, ``squeue``, ``sinfo``, ...) goes
through a *runner*: a callable that takes an argv list and returns the command's
standard output as text. The production runner, :class:`SubprocessRunner`,

* resolves the bare command name against one absolute binary directory
  (default ``/usr/bin``; Slurm hooks run without ``PATH``),
* runs it with ``shell=False``, stdout and stderr captured, and a timeout,
* forces ``SLURM_TIME_FORMAT=standard`` so timestamps always parse,
* raises :class:`SlurmCommandError` (or its subclass
  :class:`SlurmCommandTimeout`) carrying argv, return code and stderr.

Tests use :class:`FakeRunner`, which answers only the exact argv lists it was
given and raises :class:`UnexpectedCommandError` (an ``AssertionError``, so a
test cannot swallow it by catching ``SlurmCommandError``) for anything else.

Errors::

    SlurmCommandError            the command failed: non-zero exit, not found, not runnable
    └── SlurmCommandTimeout      the command ran past its timeout and was killed
    UnexpectedCommandError       (AssertionError) FakeRunner got an argv it was not told about
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DEFAULT_BIN_DIR",
    "DEFAULT_TIMEOUT_SECONDS",
    "FakeResponse",
    "FakeRunner",
    "Runner",
    "SlurmCommandError",
    "SlurmCommandTimeout",
    "SubprocessRunner",
    "UnexpectedCommandError",
]

log = logging.getLogger(__name__)

DEFAULT_BIN_DIR = "/usr/bin"
DEFAULT_TIMEOUT_SECONDS = 30.0
# Keep error messages readable when a command spews.
_STDERR_IN_MESSAGE_MAX_CHARS = 2000


class SlurmCommandError(Exception):
    """A Slurm command failed. ``returncode`` is None when it never exited normally."""

    def __init__(
        self,
        argv: Sequence[str],
        returncode: int | None,
        stderr: str,
        reason: str | None = None,
    ) -> None:
        self.argv: tuple[str, ...] = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.reason = reason or f"exited with status {returncode}"
        message = f"{' '.join(self.argv)}: {self.reason}"
        if stderr.strip():
            message += f": {stderr.strip()[:_STDERR_IN_MESSAGE_MAX_CHARS]}"
        super().__init__(message)


class SlurmCommandTimeout(SlurmCommandError):
    """The command ran longer than its timeout and was killed."""


class UnexpectedCommandError(AssertionError):
    """FakeRunner was asked to run an argv it has no answer for."""


class Runner(Protocol):
    """Runs one Slurm command and returns its stdout; raises SlurmCommandError on failure."""

    def __call__(self, argv: Sequence[str], *, timeout_seconds: float | None = None) -> str: ...


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, str):
        raise TypeError("argv must be a list of arguments, not a string")
    argv = tuple(argv)
    if not argv:
        raise ValueError("argv is empty")
    for arg in argv:
        if not isinstance(arg, str):
            raise TypeError(f"argv items must be str, got {type(arg).__name__}: {arg!r}")
    if "/" in argv[0] or argv[0] in ("", ".", ".."):
        raise ValueError(
            f"argv[0] must be a bare command name resolved in the binary directory, got {argv[0]!r}"
        )
    return argv


class SubprocessRunner:
    """Runs Slurm commands as subprocesses (no shell) from one absolute directory."""

    def __init__(
        self,
        bin_dir: str = DEFAULT_BIN_DIR,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not os.path.isabs(bin_dir):
            raise ValueError(f"bin_dir must be an absolute path, got {bin_dir!r}")
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        self.bin_dir = bin_dir
        self.timeout_seconds = timeout_seconds
        # Copied now, used at call time; no I/O here.
        self._env = dict(env) if env is not None else None

    def _environment(self) -> dict[str, str]:
        environment = dict(os.environ if self._env is None else self._env)
        # A user's SLURM_TIME_FORMAT=relative would make sacct print "Tomorr 10:00".
        environment["SLURM_TIME_FORMAT"] = "standard"
        return environment

    def __call__(self, argv: Sequence[str], *, timeout_seconds: float | None = None) -> str:
        argv = _check_argv(argv)
        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        full_argv = [os.path.join(self.bin_dir, argv[0]), *argv[1:]]
        try:
            completed = subprocess.run(
                full_argv,
                shell=False,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                env=self._environment(),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = _decode(exc.stderr) if isinstance(exc.stderr, bytes) else ""
            raise SlurmCommandTimeout(
                full_argv, None, stderr, reason=f"timed out after {timeout:g} s"
            ) from exc
        except OSError as exc:  # not found, not executable, ...
            raise SlurmCommandError(full_argv, None, "", reason=f"could not run: {exc}") from exc
        stdout = _decode(completed.stdout)
        stderr = _decode(completed.stderr)
        if completed.returncode != 0:
            raise SlurmCommandError(full_argv, completed.returncode, stderr)
        if stderr.strip():
            log.debug("%s wrote to stderr: %s", " ".join(full_argv), stderr.strip())
        return stdout


def _decode(data: bytes | None) -> str:
    # Job names and comments are user bytes; never fail on them.
    return (data or b"").decode("utf-8", errors="replace")


@dataclass(frozen=True)
class FakeResponse:
    """What FakeRunner answers for one argv."""

    stdout: str = ""
    returncode: int = 0
    stderr: str = ""
    timeout: bool = False


class FakeRunner:
    """A runner for tests that answers only the exact argv lists it was given."""

    def __init__(self, responses: Mapping[tuple[str, ...], str | FakeResponse] | None = None):
        self._responses: dict[tuple[str, ...], FakeResponse] = {}
        self.calls: list[tuple[str, ...]] = []
        for argv, response in (responses or {}).items():
            self.add(argv, response)

    def add(self, argv: Sequence[str], response: str | FakeResponse = "") -> None:
        key = _check_argv(argv)
        self._responses[key] = (
            response if isinstance(response, FakeResponse) else FakeResponse(stdout=response)
        )

    def __call__(self, argv: Sequence[str], *, timeout_seconds: float | None = None) -> str:
        key = _check_argv(argv)
        self.calls.append(key)
        try:
            response = self._responses[key]
        except KeyError:
            known = "\n  ".join(" ".join(k) for k in self._responses) or "(none)"
            raise UnexpectedCommandError(
                f"FakeRunner has no answer for argv {list(key)!r}; it knows:\n  {known}"
            ) from None
        if response.timeout:
            raise SlurmCommandTimeout(key, None, response.stderr, reason="timed out (fake)")
        if response.returncode != 0:
            raise SlurmCommandError(key, response.returncode, response.stderr)
        return response.stdout
