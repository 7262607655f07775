"""tools/plot_bench.py on JSONs that lack rows, and on files that are no benchmark JSON.

    /usr/bin/python3 tests/plot_bench_test.py

A missing or malformed JSON gives one line naming it and exit 1 (it was a traceback); a JSON without the S
shapes' rows (`tools/run bench --benchmark_filter=^gemm`) draws the charts it has rows for and skips the others
(it raised on the empty log-scaled chart and wrote none). The drawing part prints "SKIPPED: ..." without
matplotlib. Exit status 0 when all pass.
"""

import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "plot_bench.py")


def run(*args):
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def main():
    failures = []

    def check(name, condition, detail):
        print(f"{'ok' if condition else 'FAILED'}: {name}" + ("" if condition else f": {detail}"))
        if not condition:
            failures.append(name)

    with tempfile.TemporaryDirectory() as folder:
        missing = os.path.join(folder, "missing.json")
        code, text = run(missing, "--out", folder)
        check("a missing JSON is named, exit 1", code == 1 and missing in text and "Traceback" not in text, text)
        garbage = os.path.join(folder, "garbage.json")
        with open(garbage, "w") as f:
            f.write("not json")
        code, text = run(garbage, "--out", folder)
        check("a file that is not JSON is named, exit 1", code == 1 and "not a benchmark JSON" in text, text)
        for case, report in (("a row without a name", {"benchmarks": [{"nam": "x"}]}),
                             ("rows that are not objects", {"benchmarks": [1, 2]}),
                             ("a counter that is not a number",
                              {"benchmarks": [{"name": "S1_decode_gqa/threads:1", "real_time": 1.0, "floor_ms": "x"}]})):
            odd = os.path.join(folder, "odd.json")
            with open(odd, "w") as f:
                json.dump(report, f)
            code, text = run(odd, "--out", folder)
            check(f"{case}: named, exit 1", code == 1 and odd in text and "Traceback" not in text, text)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("SKIPPED: drawing needs matplotlib (apt-get install python3-matplotlib)")
            return 1 if failures else 0
        rows = [{"name": f"gemm/M:64/N:64/K:64/threads:{t}/real_time", "run_name": f"gemm/M:64/N:64/K:64/threads:{t}",
                 "run_type": "aggregate", "aggregate_name": "median", "real_time": 100.0 / t, "time_unit": "us"}
                for t in (1, 2)]
        gemm_only = os.path.join(folder, "gemm_only.json")
        with open(gemm_only, "w") as f:
            json.dump({"context": {"cpu_model": "test CPU"}, "benchmarks": rows}, f)
        code, text = run(gemm_only, "--out", folder)
        check("a JSON without S rows draws what it has", code == 0, text)
        check("  and skips the S chart, naming it", "s_shapes.png: skipped" in text, text)
        check("  and writes the thread scaling chart", os.path.exists(os.path.join(folder, "thread_scaling.png")), text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
