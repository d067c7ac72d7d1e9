"""Run the whole test suite on one CUDA GPU in parallel pytest processes that share it.

    python scripts/gpu_suite.py [--jobs 6] [--stop-after 480] [--state /tmp/gpu-suite.json] [--logs DIR] [--only A,B]

The suite is the same one `scripts/test.sh` runs on a CPU, unchanged. It is cut into units (a test
file, or for the longest files a -k slice of one), and `--jobs` pytest processes take units from a
queue, longest first. Units share the GPU through a fixed KV cache per engine
(VLLM_WEDLM_SHARED_GPU=1, see vllm_wedlm.engine_settings), because vLLM's start-up memory profiling assumes
nobody else allocates on the GPU meanwhile.

The GPU machine runs one command for at most ten minutes, so the run can be cut into several
commands: no unit starts after `--stop-after` seconds, the units done are recorded in `--state`,
and the next invocation runs the rest. Exit status 0 once every unit has passed, 1 if any failed,
3 while units remain. Each unit's pytest output goes to `--logs`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNIT_ENV = "GPU_SUITE_UNIT"  # every process of a unit carries the unit's name in it

# The files that take longest, each cut into slices that each start their own engines, with a rough
# relative cost (the queue starts the costliest first); every other file is one unit of cost 1.
SLICES = {
    "test_lossless.py": [("micro or sampled", 6), ("qwen2 or preemption", 7), ("qwen3 and not preemption", 5)],
    "test_wedlm_parity.py": [("qwen3 and scale30", 5), ("qwen2", 5), ("scale8", 2)],
    "test_serve_wedlm.py": [("not metrics and not bench", 5), ("metrics or bench", 4)],
    "test_window_invariance.py": [("qwen2", 4), ("qwen3", 4)],
    "test_benchmark_smoke.py": [("offline", 3), ("online", 3), ("step_cost or recorded", 1)],
    # Over 500 s whole beside other processes on an H100 (session 37): one engine case per unit.
    "test_structured_outputs.py": [("qwen3 and not fixed", 2), ("qwen2", 2), ("fixed", 2)],
}
COSTS = {"test_micro_model.py": 4, "test_demo.py": 3, "test_serve_window_invariance.py": 4, "test_smollm2.py": 3,
         "test_wedlm_engine.py": 3, "test_per_request_ar.py": 3, "test_serve_ar.py": 3,
         "test_training.py": 2, "test_engine_parity.py": 2, "test_stat_loggers.py": 2, "test_batch_step.py": 2}


def units() -> list[tuple[str, list[str], float]]:
    """(name, pytest arguments, cost) of every unit, costliest first."""
    found = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if path.name in SLICES:
            found += [(f"{path.name}[-k {k}]", [f"tests/{path.name}", "-k", k], cost) for k, cost in SLICES[path.name]]
        else:
            found.append((path.name, [f"tests/{path.name}"], COSTS.get(path.name, 1)))
    return sorted(found, key=lambda unit: -unit[2])


def pending(state: dict, only: list[str] | None = None) -> list[tuple[str, list[str], float]]:
    """The units still to run: never run, or cut by the time limit; with ``only``, those of the
    test files named there (``test_lossless.py`` or ``test_lossless``)."""
    return [unit for unit in units() if (unit[0] not in state or state[unit[0]]["rc"] == "timeout")
            and (not only or unit[0].split("[")[0].removesuffix(".py") in only)]


def check_slices() -> None:
    """Every test of a sliced file is in exactly one of its slices (pytest --collect-only)."""
    queries = [[f"tests/{name}", *(["-k", k] if k else [])] for name, slices in SLICES.items()
               for k in [None, *(k for k, _ in slices)]]
    with ThreadPoolExecutor(8) as pool:
        collected = dict(zip(map(tuple, queries), pool.map(_collect, queries), strict=True))
    for name, slices in SLICES.items():
        whole = collected[(f"tests/{name}",)]
        parts = [test for k, _ in slices for test in collected[(f"tests/{name}", "-k", k)]]
        if sorted(parts) != sorted(whole) or not whole:
            raise SystemExit(f"the -k slices of {name} do not cover its {len(whole)} tests exactly once")


def _collect(args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         cwd=ROOT, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "::" in line]


def run_unit(name: str, args: list[str], logs: Path, deadline: float, threads: int) -> dict:
    # Letters, digits, '.', '-' and '_' only: the device machine sends back no file with other characters in its name.
    log = logs / (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") + ".log")
    # Each unit gets its share of the cores: torch's CPU ops otherwise start a thread per core in
    # every process, and --jobs processes oversubscribe the machine many times over.
    env = {**os.environ, "VLLM_WEDLM_SHARED_GPU": "1", "OMP_NUM_THREADS": str(threads), UNIT_ENV: name}
    began = time.time()
    with log.open("w") as out:
        # Its own process group, so that a unit cut at the deadline takes its engines and servers with it.
        child = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                                 env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = child.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            rc = "timeout"
    leftovers = kill_leftovers(name)
    lines = log.read_text(errors="replace").splitlines()
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line
                                                                          or "error" in line)), "")
    return {"rc": rc, "seconds": round(time.time() - began), "summary": summary.strip("= "), "leftovers": leftovers}


def kill_leftovers(name: str) -> int:
    """Kill the processes the unit ``name`` left behind; how many there were.

    ``vllm serve`` processes start their own sessions (vllm_wedlm.server_process), so a unit cut
    at the deadline leaves them running, holding GPU memory that the next units' engines need.
    Every process of a unit inherits its ``UNIT_ENV`` variable, which is how they are found.
    """
    marker = f"{UNIT_ENV}={name}".encode()
    killed = 0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
        except OSError:
            pass  # gone meanwhile, or not ours to read
    return killed


def watch_gpu_memory(log: Path, running: dict, stop: threading.Event) -> None:
    """Every 20 s, the GPU memory in use and the units running, appended to ``log``."""
    while not stop.wait(20):
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip()
        with log.open("a") as out:
            out.write(f"{time.strftime('%H:%M:%S')}  {used}  {sorted(running.values())}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--stop-after", type=float, default=480, help="start no unit after this many seconds")
    parser.add_argument("--limit", type=float, default=585, help="kill units still running after this many seconds")
    parser.add_argument("--state", type=Path, default=Path("/tmp/gpu-suite.json"))
    parser.add_argument("--logs", type=Path, default=Path("/tmp/gpu-suite-logs"))
    parser.add_argument("--cheapest-first", action="store_true",
                        help="start the cheap units first (the most units done in a short command)")
    parser.add_argument("--only", help="comma-separated test files: run only their units")
    args = parser.parse_args()
    only = [name.removesuffix(".py") for name in args.only.split(",")] if args.only else None
    start = time.time()  # the command's clock: --stop-after and --limit count from here
    args.logs.mkdir(parents=True, exist_ok=True)
    check_slices()
    state = json.loads(args.state.read_text()) if args.state.is_file() else {}
    todo = pending(state, only)
    if args.cheapest_first:
        todo.reverse()
    running = {}
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    stop_watching = threading.Event()
    if shutil.which("nvidia-smi"):
        threading.Thread(target=watch_gpu_memory, args=(args.logs / "gpu-memory.log", running, stop_watching),
                         daemon=True).start()
    with ThreadPoolExecutor(args.jobs) as pool:
        while todo or running:
            while todo and len(running) < args.jobs and time.time() - start < args.stop_after:
                name, pytest_args, _ = todo.pop(0)
                running[pool.submit(run_unit, name, pytest_args, args.logs, start + args.limit, threads)] = name
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                name = running.pop(future)
                state[name] = future.result()
                args.state.write_text(json.dumps(state, indent=1))
                print(f"{time.time() - start:5.0f}s  {name:55} rc={state[name]['rc']}  {state[name]['seconds']}s  "
                      f"{state[name]['summary']}", flush=True)
    stop_watching.set()
    remaining = [unit[0] for unit in pending(state, only)]
    failed = [name for name, result in state.items() if result["rc"] not in (0, "timeout")]
    chosen = len(pending({}, only))
    print(f"done {chosen - len(remaining)}/{chosen} units, failed: {failed or 'none'}, "
          f"remaining: {remaining or 'none'}")
    return 1 if failed else 3 if remaining else 0


if __name__ == "__main__":
    sys.exit(main())
