"""Where a command's CPU time goes, process by process: each Python process of a virtual environment logs its own.

`install` puts a startup hook into the environment's site-packages (a `.pth`
file and its module). Every Python process of that environment started with
`PROCESS_CPU_LOG=FILE` then appends one JSON line to FILE when it exits: its
arguments, wall seconds, user and system CPU seconds (`getrusage` of the
process itself, not its children), peak resident memory, minor page faults, bytes written, whether it imported
TensorFlow or JAX, and the test it ran for (`PYTEST_CURRENT_TEST`, which a
test's child processes inherit). Without the variable the hook does nothing.
A process killed by a signal writes no line. `report` sums a log by role
(the pytest process, its xdist workers, the tests' children) and by test file.

    python tools/process_cpu.py install .venv
    PROCESS_CPU_LOG=/tmp/cpu.jsonl .venv/bin/python -m pytest -q -n 2 tests
    python tools/process_cpu.py report /tmp/cpu.jsonl
    python tools/process_cpu.py remove .venv
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys

HOOK_MODULE = "process_cpu_hook"
HOOK_SOURCE = """import os

if os.environ.get("PROCESS_CPU_LOG"):
    import atexit
    import json
    import resource
    import sys
    import time

    _started = time.time()

    def _bytes_written():
        # /proc/self/io: `wchar` counts every write() call, `write_bytes` what reached the disk.
        try:
            with open("/proc/self/io", encoding="ascii") as handle:
                fields = dict(line.split(": ") for line in handle.read().splitlines())
            return int(fields["wchar"]), int(fields["write_bytes"])
        except (OSError, KeyError, ValueError):
            return 0, 0

    def _write_record():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        written, to_disk = _bytes_written()
        record = {
            "pid": os.getpid(),
            "argv": sys.argv[:4],
            "wall_s": round(time.time() - _started, 2),
            "user_s": round(usage.ru_utime, 2),
            "system_s": round(usage.ru_stime, 2),
            "peak_mb": usage.ru_maxrss // 1024,
            "minor_faults": usage.ru_minflt,
            "written_mb": written // 2**20,
            "to_disk_mb": to_disk // 2**20,
            "tensorflow": "tensorflow" in sys.modules,
            "jax": "jax" in sys.modules,
            "xdist_worker": os.environ.get("PYTEST_XDIST_WORKER"),
            "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
        }
        with open(os.environ["PROCESS_CPU_LOG"], "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\\n")

    atexit.register(_write_record)
"""


def site_packages(venv: str) -> str:
    """The site-packages folder of the virtual environment `venv`."""
    found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
    if not found:
        raise SystemExit(f"no lib/python3*/site-packages in {venv}: give a virtual environment's folder")
    return found[0]


def install(venv: str) -> None:
    folder = site_packages(venv)
    with open(os.path.join(folder, f"{HOOK_MODULE}.py"), "w", encoding="utf-8") as handle:
        handle.write(HOOK_SOURCE)
    with open(os.path.join(folder, f"{HOOK_MODULE}.pth"), "w", encoding="utf-8") as handle:
        handle.write(f"import {HOOK_MODULE}\n")
    print(f"installed in {folder}; set PROCESS_CPU_LOG=FILE to log")


def remove(venv: str) -> None:
    folder = site_packages(venv)
    for suffix in (".py", ".pth"):
        path = os.path.join(folder, HOOK_MODULE + suffix)
        if os.path.exists(path):
            os.remove(path)
    print(f"removed from {folder}")


def role(record: dict) -> str:
    """ "pytest" (no xdist worker variable), "xdist worker" (no test running), or "test child"."""
    if record["test"]:
        return "test child"
    return "xdist worker" if record["xdist_worker"] else "pytest"


def report(log: str, top: int) -> None:
    with open(log, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    cpu = collections.Counter()
    system = collections.Counter()
    faults = collections.Counter()
    written = collections.Counter()
    count = collections.Counter()
    by_file = collections.Counter()
    files = collections.Counter()
    for record in records:
        seconds = record["user_s"] + record["system_s"]
        cpu[role(record)] += seconds
        system[role(record)] += record["system_s"]
        faults[role(record)] += record.get("minor_faults", 0)
        written[role(record)] += record.get("written_mb", 0)
        count[role(record)] += 1
        if record["test"]:
            name = record["test"].split("::")[0]
            by_file[name] += seconds
            files[name] += 1
    total = sum(cpu.values())
    print(f"{len(records)} processes, {total:,.0f} s of CPU (user + system)")
    for name, seconds in cpu.most_common():
        print(
            f"  {name:<13} {count[name]:4d} processes {seconds:8,.0f} s ({system[name]:,.0f} s system),"
            f" {faults[name] / 1e6:6.1f} M minor page faults, {written[name] / 1024:6.1f} GB written"
        )
    print("test children by test file:")
    for name, seconds in by_file.most_common(top):
        print(f"  {seconds:8,.0f} s {files[name]:4d} processes  {name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tools/process_cpu.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("install", "remove"):
        commands.add_parser(name).add_argument("venv", help="a virtual environment's folder, e.g. .venv")
    report_parser = commands.add_parser("report")
    report_parser.add_argument("log", help="the PROCESS_CPU_LOG file")
    report_parser.add_argument("--top", type=int, default=20, help="test files listed")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        report(args.log, args.top)
    else:
        {"install": install, "remove": remove}[args.command](args.venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
