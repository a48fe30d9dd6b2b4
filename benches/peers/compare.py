"""reflex's learner beside SBX (JAX) in one invocation: alternating runs, medians, ratios.

Each repetition runs `reflex bench learner --json` (with one thread, and with every core) and
then `sbx_bench.py` in fresh processes, one after the other, so both see the same machine in the
same minutes. Prints a table and, with --json, the raw runs and the medians.

With --kernel avx2 on an AVX-512 processor both sides are held to AVX2, to time what an
AVX2-only machine runs: reflex's matrix kernel by `--kernel avx2`, XLA's generated code by
XLA_FLAGS=--xla_cpu_max_isa=AVX2. The processor's model and vector flags go into the report.

usage: python compare.py --reflex target/release/reflex [--reps 3] [--updates 1000]
                         [--pendulum-steps 10000] [--kernel avx512|avx2] [--json]
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


XLA_ISA = {"avx512": "AVX512", "avx2": "AVX2"}


def cpu():
    """The processor's model name and the vector flags that decide the kernels."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ["avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl"]
    return {"model": model, "cores": os.cpu_count(), "flags": [x for x in wanted if x in flags]}


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
    p.add_argument("--kernel", choices=sorted(XLA_ISA),
                   help="hold both sides to this instruction set (default: each its fastest)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    kernel_args = ["--kernel", a.kernel] if a.kernel else []
    sbx_env = dict(os.environ)
    if a.kernel:
        sbx_env["XLA_FLAGS"] = (sbx_env.get("XLA_FLAGS", "") +
                                f" --xla_cpu_max_isa={XLA_ISA[a.kernel]}").strip()
    paths = set()
    here = os.path.dirname(os.path.abspath(__file__))
    runs = {"reflex_1_thread": [], f"reflex_{a.threads}_threads": [], "sbx": []}
    for rep in range(a.reps):
        for threads in (1, a.threads):
            v = run_json([a.reflex, "bench", "learner", "--json", "--threads", str(threads),
                          "--updates", str(a.updates), "--pendulum-steps", str(a.pendulum_steps)]
                         + kernel_args)
            paths.add(v.get("kernel", "unknown"))
            runs[f"reflex_{threads}_thread" + ("s" if threads > 1 else "")].append(figures(v))
        v = run_json([sys.executable, os.path.join(here, "sbx_bench.py"), "--updates", str(a.updates),
                      "--pendulum-steps", str(a.pendulum_steps)], env=sbx_env)
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
        print(json.dumps({"reps": a.reps, "cpu": cpu(), "reflex_kernel": sorted(paths),
                          "xla_flags": sbx_env.get("XLA_FLAGS", ""),
                          "runs": runs, "medians": med,
                          "ratios": [{"reflex": r[0], "config": r[1], "reflex_value": r[2],
                                      "sbx_value": r[3], "speedup": r[4]} for r in rows]}, indent=2))
    else:
        c = cpu()
        print(f"{c['model']}, {c['cores']} cores, flags {' '.join(c['flags'])}; reflex kernel "
              f"{', '.join(sorted(paths))}; XLA_FLAGS '{sbx_env.get('XLA_FLAGS', '')}'")
        print(f"medians of {a.reps} alternating runs (updates/s, or seconds for Pendulum)")
        for who, c, x, y, ratio in rows:
            print(f"{who:18} {c:28} reflex {x:9.2f}  sbx {y:9.2f}  reflex faster x{ratio:.2f}")
        for who in med:
            if "pendulum_return" in med[who]:
                print(f"{who:18} Pendulum final return (median) {med[who]['pendulum_return']:.1f}")


if __name__ == "__main__":
    main()
