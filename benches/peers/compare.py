"""reflex's learner beside SBX (JAX) in one invocation: alternating runs, medians, ratios.

Each repetition runs `reflex bench learner --json` (with one thread, and with every core) and
then `sbx_bench.py` in fresh processes, one after the other, so both see the same machine in the
same minutes. Prints a table and, with --json, the raw runs and the medians.

usage: python compare.py --reflex target/release/reflex [--reps 3] [--updates 1000]
                         [--pendulum-steps 10000] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CONFIGS = ["a_64x64_b100_2critics", "b_256x256_b256_2critics", "c_256x256_b256_10critics"]


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def figures(v):
    f = {c: v[c]["updates_per_s"] for c in CONFIGS}
    if "pendulum" in v:
        f["pendulum_wall_s"] = v["pendulum"]["wall_s"]
        f["pendulum_return"] = v["pendulum"]["final_return"]
    return f


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reflex", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--updates", type=int, default=1000)
    p.add_argument("--pendulum-steps", type=int, default=10000)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    runs = {"reflex_1_thread": [], f"reflex_{a.threads}_threads": [], "sbx": []}
    for rep in range(a.reps):
        for threads in (1, a.threads):
            v = run_json([a.reflex, "bench", "learner", "--json", "--threads", str(threads),
                          "--updates", str(a.updates), "--pendulum-steps", str(a.pendulum_steps)])
            runs[f"reflex_{threads}_thread" + ("s" if threads > 1 else "")].append(figures(v))
        v = run_json([sys.executable, os.path.join(here, "sbx_bench.py"), "--updates", str(a.updates),
                      "--pendulum-steps", str(a.pendulum_steps)])
        runs["sbx"].append(figures(v))
        print(f"repetition {rep + 1}/{a.reps} done", file=sys.stderr)
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items() if v}
    rows = []
    for who in med:
        if who == "sbx":
            continue
        for c in CONFIGS:
            rows.append((who, c, med[who][c], med["sbx"][c], med[who][c] / med["sbx"][c]))
        if "pendulum_wall_s" in med[who]:
            rows.append((who, "pendulum 10k steps (s)", med[who]["pendulum_wall_s"],
                         med["sbx"]["pendulum_wall_s"],
                         med["sbx"]["pendulum_wall_s"] / med[who]["pendulum_wall_s"]))
    if a.json:
        print(json.dumps({"reps": a.reps, "runs": runs, "medians": med,
                          "ratios": [{"reflex": r[0], "config": r[1], "reflex_value": r[2],
                                      "sbx_value": r[3], "speedup": r[4]} for r in rows]}, indent=2))
    else:
        print(f"medians of {a.reps} alternating runs (updates/s, or seconds for Pendulum)")
        for who, c, x, y, ratio in rows:
            print(f"{who:18} {c:28} reflex {x:9.2f}  sbx {y:9.2f}  reflex faster x{ratio:.2f}")
        for who in med:
            if "pendulum_return" in med[who]:
                print(f"{who:18} Pendulum final return (median) {med[who]['pendulum_return']:.1f}")


if __name__ == "__main__":
    main()
