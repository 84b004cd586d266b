"""The suites, round after round, while a CPU hog takes every cycle they leave (make test-stress).

    python -m tests.support.stress --rounds N --out DIR -- COMMAND [ARG ...]

Runs COMMAND (the suites, side by side as ``make test`` runs them) N times back to back with
``JUNIT_DIR=DIR/round-R`` in its environment: the Makefile's suites each write their JUnit XML
file there. Meanwhile a hog keeps every core busy at the lowest priority (``nice -n 19``):
``stress-ng`` where it is installed, else one Python busy loop per core. So every cycle the
suites do not take is taken, and a test that counts on an idle core (a sleep as
synchronisation, a deadline measured on an idle machine) fails in some round. The hog is
stopped on every way out: the end, an error, Ctrl-C, SIGTERM.

At the end it prints the rounds, the tests each suite ran per round, and every test that
failed at least once: in which round, of which suite, and the first lines of its failure;
each round's whole output is in DIR/round-R.log. It exits 1 if any test failed (or a suite
ended badly without a test to blame), else 0. Standard library only: it runs before anything
else is known to work.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: How many lines of a failure the summary shows (the round's log and XML have it whole).
FAILURE_LINES = 12


@dataclass
class Failure:
    round: int
    suite: str
    kind: str  # failure or error
    text: str


@dataclass
class Round:
    number: int
    status: int
    seconds: float
    tests: dict[str, int] = field(default_factory=dict)  # suite -> tests run
    missing: list[str] = field(default_factory=list)  # suites that wrote no XML


def hog_command() -> list[str]:
    """Every core busy at nice 19: stress-ng's CPU stressor, else Python loops."""
    cores = os.cpu_count() or 1
    if shutil.which("stress-ng"):
        return ["nice", "-n", "19", "stress-ng", "--cpu", str(cores), "--quiet"]
    # One process per core: the first forks the others (all in the hog's session), each spins.
    loops = (
        f"import os\nfor _ in range({cores - 1}):\n    if os.fork() == 0: break\nwhile True: pass"
    )
    return ["nice", "-n", "19", sys.executable, "-c", loops]


@contextlib.contextmanager
def hog() -> Iterator[None]:
    """The hog, in a session of its own (so it is stopped as a whole) for the ``with`` block."""
    command = hog_command()
    print(f"== hog: {' '.join(command[:6])}{' …' if len(command) > 6 else ''}", flush=True)
    proc = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # The loops' children (the fallback's) are in its session too: none is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def run_round(number: int, out: Path, command: list[str]) -> tuple[Round, list[Failure]]:
    directory = out / f"round-{number}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    log = out / f"round-{number}.log"
    print(f"== {time.strftime('%H:%M:%S')} round {number}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    with open(log, "wb") as output:
        proc = subprocess.Popen(
            command, env={**os.environ, "JUNIT_DIR": str(directory)}, stdout=output, stderr=output
        )
        try:
            status = proc.wait()
        finally:  # Ctrl-C reached it too (one process group); an error here did not
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    result = Round(number, status, time.monotonic() - started)
    failures: list[Failure] = []
    for xml in sorted(directory.glob("*.xml")):
        suite = xml.stem
        try:
            root = ET.parse(xml).getroot()  # noqa: S314 (our own pytest wrote it)
        except ET.ParseError as exc:
            result.missing.append(f"{suite} (unreadable XML: {exc})")
            continue
        run = 0
        for case in root.iter("testcase"):
            problems = [c for c in case if c.tag in ("failure", "error")]
            skipped = any(c.tag == "skipped" for c in case)
            if not skipped:
                run += 1
            for problem in problems:
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                text = (problem.get("message") or "") + "\n" + (problem.text or "")
                failures.append(Failure(number, suite, f"{problem.tag} {name}", text.strip()))
        result.tests[suite] = run
    if not result.tests:
        result.missing.append("every suite (no JUnit XML at all)")
    return result, failures


def summary(rounds: list[Round], failures: list[Failure], out: Path) -> str:
    lines = [f"== stress summary: {len(rounds)} round(s), logs in {out}/round-N.log"]
    for r in rounds:
        tests = ", ".join(f"{suite} {n}" for suite, n in sorted(r.tests.items())) or "none"
        minutes = f"{r.seconds / 60:.1f} min"
        lines.append(f"round {r.number}: exit {r.status}, {minutes}, tests run: {tests}")
        lines.extend(f"round {r.number}: MISSING {what}" for what in r.missing)
    by_test: dict[str, list[Failure]] = {}
    for failure in failures:
        by_test.setdefault(failure.kind, []).append(failure)
    if not by_test:
        lines.append("no test failed in any round")
    else:
        lines.append(f"{len(by_test)} test(s) failed at least once:")
    for name, seen in sorted(by_test.items()):
        where = ", ".join(f"round {f.round} ({f.suite})" for f in seen)
        lines.append(f"\n-- {name}: failed {len(seen)} time(s), in {where}")
        for f in seen:
            head = f.text.splitlines()[:FAILURE_LINES]
            lines.append(f"   round {f.round} ({f.suite}):")
            lines.extend(f"     {line}" for line in head)
    blamed = {f.round for f in failures}
    for r in rounds:
        if r.status != 0 and r.number not in blamed:
            log = out / f"round-{r.number}.log"
            lines.append(f"\nround {r.number} exited {r.status} without a failed test: see {log}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(".stress"))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    # SIGTERM (a CI cancel, make killed) unwinds as Ctrl-C does: the hog is stopped either way.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rounds: list[Round] = []
    failures: list[Failure] = []
    started = time.monotonic()
    try:
        with hog():
            for number in range(1, args.rounds + 1):
                result, failed = run_round(number, out, command)
                rounds.append(result)
                failures.extend(failed)
                print(
                    f"== round {number}: exit {result.status} in {result.seconds / 60:.1f} min, "
                    f"{len(failed)} failure(s)",
                    flush=True,
                )
    finally:
        text = summary(rounds, failures, out)
        wall = (time.monotonic() - started) / 60
        text += f"\n== {time.strftime('%H:%M:%S')} wall time {wall:.1f} min"
        (out / "summary.txt").write_text(text + "\n")
        print(text, flush=True)
    bad = failures or any(r.status != 0 or r.missing for r in rounds)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
