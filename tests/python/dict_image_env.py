"""A small Gymnasium environment with a Dict observation (vectors and a camera image), a success
flag and a person's action in `info`: the bridge test's stand-in for a user's own simulator.

Registered as `DictImage-v0` when imported, so `gym.make("dict_image_env:DictImage-v0")` finds it
(gymnasium's `module:EnvId` form). A point moves in the plane toward a goal; the camera shows the
point as a white pixel on a 16x16 image.
"""

import gymnasium as gym
import numpy as np


class DictImage(gym.Env):
    metadata = {"render_fps": 20}

    def __init__(self, size=16, person_every=0):
        self.size = size
        self.person_every = person_every
        self.observation_space = gym.spaces.Dict({
            "position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "velocity": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "camera": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
        })
        self.action_space = gym.spaces.Box(-0.1, 0.1, (2,), np.float32)
        self.t = 0

    def _obs(self):
        img = np.zeros((self.size, self.size, 3), np.uint8)
        px = np.clip(((self.pos + 1.0) / 2.0 * (self.size - 1)).round().astype(int), 0, self.size - 1)
        img[px[1], px[0]] = 255
        return {"position": self.pos.astype(np.float32), "velocity": self.vel.astype(np.float32), "camera": img}

    def _info(self):
        info = {"is_success": bool(np.linalg.norm(self.pos - self.goal) < 0.1)}
        if self.person_every and self.t % self.person_every == 0 and self.t > 0:
            info["person_action"] = np.array([0.05, -0.05], np.float32)
        return info

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.5, 0.5, 2)
        self.goal = self.np_random.uniform(-0.5, 0.5, 2)
        self.vel = np.zeros(2)
        self.t = 0
        return self._obs(), self._info()

    def step(self, action):
        a = np.clip(np.asarray(action, np.float64), -0.1, 0.1)
        self.vel = a
        self.pos = np.clip(self.pos + a, -1.0, 1.0)
        self.t += 1
        info = self._info()
        return self._obs(), float(info["is_success"]), info["is_success"], False, info


gym.register(id="DictImage-v0", entry_point=DictImage, max_episode_steps=30)


class NestedImage(DictImage):
    """The same task with its observation nested as several manipulation suites lay it out:
    proprioception under `agent`, cameras grouped under `pixels` (a colour camera, a grey one,
    and a channels-first one)."""

    def __init__(self, size=16, person_every=0):
        super().__init__(size, person_every)
        self.observation_space = gym.spaces.Dict({
            "agent": gym.spaces.Dict({
                "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                "vel": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            }),
            "pixels": gym.spaces.Dict({
                "front": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
                "wrist": gym.spaces.Box(0, 255, (size // 2, size // 2, 1), np.uint8),
                "top": gym.spaces.Box(0, 255, (3, size, size * 2), np.uint8),
            }),
        })

    def _obs(self):
        flat = super()._obs()
        # Half size, max-pooled so the point stays visible.
        c = flat["camera"][:, :, :1]
        grey = c.reshape(self.size // 2, 2, self.size // 2, 2, 1).max(axis=(1, 3))
        top = np.zeros((3, self.size, self.size * 2), np.uint8)
        top[0] = 7  # a red plane: channels first, so the bridge must transpose it
        return {
            "agent": {"pos": flat["position"], "vel": flat["velocity"]},
            "pixels": {"front": flat["camera"], "wrist": grey, "top": top},
        }


gym.register(id="NestedImage-v0", entry_point=NestedImage, max_episode_steps=30)
