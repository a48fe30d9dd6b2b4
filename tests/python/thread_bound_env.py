"""A Gymnasium environment that works only on the thread that created it, with camera images of
about 100 KB an observation: the bridge test's stand-in for a rendering simulator (gym-hil on
MuJoCo with `image_obs=True`), without MuJoCo.

MuJoCo's EGL context belongs to the thread that made the environment: `reset` or `step` on
another thread fails with EGL_BAD_ACCESS. This environment raises the same way, so a bridge that
calls it from Zenoh's callback threads fails here as it fails there.

Registered as `ThreadBound-v0` when imported (`thread_bound_env:ThreadBound-v0`). A point moves in
the plane toward the centre; two 128x128 RGB cameras, grouped under `pixels` as gym-hil does
(`pixels.front`, `pixels.wrist`), show it. Success when it is within 0.05 of the centre.
"""

import threading

import gymnasium as gym
import numpy as np

SIZE = 128


class ThreadBound(gym.Env):
    metadata = {"render_fps": 10, "render_modes": []}

    def __init__(self):
        self.owner = threading.get_ident()
        self.observation_space = gym.spaces.Dict({
            "agent_pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "pixels": gym.spaces.Dict({
                "front": gym.spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8),
                "wrist": gym.spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8),
            }),
        })
        self.action_space = gym.spaces.Box(-0.1, 0.1, (2,), np.float32)
        self.pos = np.zeros(2)

    def _on_owner_thread(self, what):
        if threading.get_ident() != self.owner:
            raise RuntimeError(
                f"{what} called on thread {threading.get_ident()}, but the rendering context belongs to "
                f"thread {self.owner}, which created the environment (EGL_BAD_ACCESS)")

    def _obs(self):
        front = np.zeros((SIZE, SIZE, 3), np.uint8)
        px = np.clip(((self.pos + 1.0) / 2.0 * (SIZE - 1)).round().astype(int), 0, SIZE - 1)
        front[px[1], px[0]] = 255
        front[:, :, 2] = 40  # a blue background: the policy's mean differs per camera
        wrist = np.full((SIZE, SIZE, 3), 90, np.uint8)
        wrist[: SIZE // 2, :, 0] = np.uint8(min(255, int(abs(self.pos[0]) * 255)))
        return {"agent_pos": self.pos.astype(np.float32), "pixels": {"front": front, "wrist": wrist}}

    def reset(self, seed=None, options=None):
        self._on_owner_thread("reset")
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.5, 0.5, 2)
        return self._obs(), {"is_success": False}

    def step(self, action):
        self._on_owner_thread("step")
        self.pos = np.clip(self.pos + np.clip(np.asarray(action, np.float64), -0.1, 0.1), -1.0, 1.0)
        success = bool(np.linalg.norm(self.pos) < 0.05)
        return self._obs(), float(success), success, False, {"is_success": success}


gym.register(id="ThreadBound-v0", entry_point=ThreadBound, max_episode_steps=12)
