"""Drives gymnasium's Pendulum-v1 directly with the actions in a JSON file and prints the
trajectory as JSON: the reference the reflex bridge test compares against."""
import json
import sys

import gymnasium as gym
import numpy as np

seed, actions_file = int(sys.argv[1]), sys.argv[2]
actions = json.load(open(actions_file))
env = gym.make("Pendulum-v1")
obs, _ = env.reset(seed=seed)
states, rewards = [[float(x) for x in obs]], []
for a in actions:
    obs, r, term, trunc, _ = env.step(np.asarray(a, dtype=np.float32))
    states.append([float(x) for x in obs])
    rewards.append(float(np.float32(r)))
print(json.dumps({"states": states, "rewards": rewards}))
