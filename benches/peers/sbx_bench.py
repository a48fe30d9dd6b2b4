"""SAC throughput of SBX (JAX) in the configurations of `reflex bench learner`, on this machine.

  (a) 64x64 nets, batch 100, 2 critics
  (b) 256x256, batch 256, 2 critics
  (c) 256x256, batch 256, 10 critics (SBX's `n_critics`; its target takes the min over all of them)
  and the wall time of 10k Pendulum-v1 steps with one update per step (64x64, batch 100).

One "update" is one SBX gradient step (critic, actor and temperature), as in reflex. Prints JSON.
usage: python sbx_bench.py [--updates N] [--pendulum-steps N]
"""
import argparse
import json
import time

import gymnasium as gym
import numpy as np
from sbx import SAC


def updates_per_s(hidden, batch, critics, updates):
    env = gym.make("Pendulum-v1")
    model = SAC(
        "MlpPolicy",
        env,
        batch_size=batch,
        learning_starts=0,
        policy_kwargs=dict(net_arch=[hidden, hidden], n_critics=critics),
        seed=1,
        verbose=0,
    )
    # Fill the buffer with 5000 random transitions, then time gradient steps only.
    model.learn(total_timesteps=5000, progress_bar=False)
    model.train(gradient_steps=20, batch_size=batch)  # compile
    t0 = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=batch)
    return updates / (time.perf_counter() - t0)


def pendulum(steps):
    env = gym.make("Pendulum-v1")
    model = SAC("MlpPolicy", env, batch_size=100, learning_starts=100, policy_kwargs=dict(net_arch=[64, 64]), seed=1, verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps, progress_bar=False)
    wall = time.perf_counter() - t0
    rets = []
    for ep in range(5):
        obs, _ = env.reset(seed=1000 + ep)
        total, done = 0.0, False
        while not done:
            a, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = env.step(a)
            total += r
            done = term or trunc
        rets.append(total)
    return wall, float(np.mean(rets))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--updates", type=int, default=1000)
    p.add_argument("--pendulum-steps", type=int, default=10000)
    a = p.parse_args()
    out = {}
    for name, h, b, n in [("a_64x64_b100_2critics", 64, 100, 2), ("b_256x256_b256_2critics", 256, 256, 2), ("c_256x256_b256_10critics", 256, 256, 10)]:
        out[name] = {"updates_per_s": updates_per_s(h, b, n, a.updates), "hidden": h, "batch": b, "critics": n}
    if a.pendulum_steps:
        wall, ret = pendulum(a.pendulum_steps)
        out["pendulum"] = {"steps": a.pendulum_steps, "wall_s": wall, "final_return": ret}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
