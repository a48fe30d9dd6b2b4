#!/usr/bin/env python3
"""Serve any Gymnasium environment as a reflex robot over Zenoh.

The environment answers the reflex robot protocol (docs/protocol.md) under `reflex/<robot>/...`:
`spec` and `reset` queries, `cmd` -> `obs` in lockstep, episode `events`, and a liveliness token on
`reflex/<robot>/alive/robot`. reflex (or anything else that speaks the protocol) can then drive it
exactly like the built-in simulator or a real arm:

    python sim/python/reflex_gym_bridge.py --env Pendulum-v1 --robot pendulum \\
        --listen tcp/127.0.0.1:7447 --no-multicast

Environments a package registers are named `module:EnvId` (gymnasium imports the module first),
and `--env-kwargs '{"key": value}'` goes to the environment's constructor.

What the spec says about the environment (docs/sim.md, "Bring your own simulator"):
- a Box observation becomes one state field `obs` with the Box's bounds (infinite where the Box
  is unbounded); a Dict observation becomes one state field per key, in the Dict's order, and
  every image in it becomes a camera of that name instead. Dicts may nest (cameras grouped under
  one key, as several manipulation suites do): a leaf is named by its path with dots
  (`pixels.front`, `agent.pos`), so an image is always a camera, never tens of thousands of state
  values. An image is a uint8 Box of HxWx3, HxWx1 (grey, sent as RGB) or 3xHxW (channels first,
  sent as HxWx3);
- the action space must be a bounded Box;
- success is read from `info` under the first of `--success-key` (default: is_success, success,
  succeed) that is present;
- `--intervention-key K`: when `info[K]` holds an action, a person (the environment's own
  teleoperation) is driving: the bridge publishes it on `reflex/<robot>/teleop` as a takeover
  (before the observation it came with, so the actor's next command is the person's), and hands
  back when the key disappears.

Requirements: gymnasium, eclipse-zenoh (same version as reflex's zenoh crate), msgpack, numpy.
"""

import argparse
import json
import sys
import threading
import time

import gymnasium as gym
import msgpack
import numpy as np
import zenoh

PROTOCOL_VERSION = 1
DEFAULT_SUCCESS_KEYS = ["is_success", "success", "succeed"]


def pack(msg):
    # float32 on the wire, like reflex: values round-trip bit-exactly.
    return msgpack.packb(msg, use_single_float=True)


def image_layout(space):
    """How a space holds an image: "hwc", "hw1" (grey), "chw" (channels first), or None."""
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8 or len(space.shape) != 3:
        return None
    h, w, c = space.shape
    if c == 3:
        return "hwc"
    if c == 1:
        return "hw1"
    if h == 3 and w > 3 and c > 3:
        return "chw"
    return None


def is_image(space):
    return image_layout(space) is not None


def image_size(space):
    """(width, height) of an image space."""
    if image_layout(space) == "chw":
        return int(space.shape[2]), int(space.shape[1])
    return int(space.shape[1]), int(space.shape[0])


def to_rgb(img, layout):
    a = np.asarray(img, dtype=np.uint8)
    if layout == "hw1":
        a = np.repeat(a, 3, axis=2)
    elif layout == "chw":
        a = np.transpose(a, (1, 2, 0))
    return np.ascontiguousarray(a)


def leaves(space, path=()):
    """The leaves of a (nested) Dict space with their key paths, in order."""
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            yield from leaves(sub, path + (key,))
    else:
        yield path, space


def at(obs, path):
    for key in path:
        obs = obs[key]
    return obs


def f32_list(a):
    return [float(x) for x in np.asarray(a, dtype=np.float32).ravel()]


def bounds(space):
    """Lower and upper bounds of a flattened space (infinite where unbounded)."""
    flat = gym.spaces.flatten_space(space)
    return f32_list(flat.low), f32_list(flat.high)


class Layout:
    """How an observation maps to reflex's state vector and cameras."""

    def __init__(self, space, env_id):
        self.fields = []  # (name, path, space)
        self.cameras = []  # (name, path, space)
        for path, sub in leaves(space):
            if is_image(sub):
                self.cameras.append((".".join(path) or "image", path, sub))
            else:
                self.fields.append((".".join(path) or "obs", path, sub))
        self.env_id = env_id

    def spec_fields(self):
        out = []
        for name, path, sub in self.fields:
            low, high = bounds(sub)
            out.append({
                "name": name,
                "size": len(low),
                "unit": f"{self.env_id} observation" + (f" `{name}`" if path else "") + ", flattened",
                "low": low,
                "high": high,
            })
        return out

    def spec_cameras(self):
        out = []
        for name, _, s in self.cameras:
            w, h = image_size(s)
            out.append({"name": name, "width": w, "height": h})
        return out

    def state(self, obs):
        out = []
        for _, path, sub in self.fields:
            out.extend(f32_list(gym.spaces.flatten(sub, at(obs, path))))
        return out

    def images(self, obs):
        out = []
        for name, path, sub in self.cameras:
            img = to_rgb(at(obs, path), image_layout(sub))
            w, h = image_size(sub)
            out.append({"camera": name, "width": w, "height": h, "encoding": "rgb8", "data": img.tobytes()})
        return out


def make_spec(env, robot, env_id, layout):
    act = env.action_space
    if not isinstance(act, gym.spaces.Box):
        raise SystemExit(f"{env_id}: action space {act} is not a gymnasium Box; reflex drives continuous actions")
    low, high = f32_list(act.low), f32_list(act.high)
    if not all(np.isfinite(low)) or not all(np.isfinite(high)):
        raise SystemExit(f"{env_id}: the action Box {act} is unbounded; reflex needs finite action bounds")
    max_steps = env.spec.max_episode_steps if env.spec is not None and env.spec.max_episode_steps else 0
    return {
        "v": PROTOCOL_VERSION,
        "name": robot,
        "kind": f"gym/{env_id}",
        "control_hz": float(env.metadata.get("render_fps", 30) or 30),
        "lockstep": True,
        "state": layout.spec_fields(),
        "action": {
            "kind": "box",
            "names": [f"a{i}" for i in range(len(low))],
            "low": low,
            "high": high,
        },
        "cameras": layout.spec_cameras(),
        "joints": [],
        "max_episode_steps": int(max_steps),
    }


def success_of(info, keys):
    for k in keys:
        if k in info:
            return bool(np.asarray(info[k]).item())
    return False


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="Gymnasium environment id, e.g. Pendulum-v1 or my_pkg:MyEnv-v0")
    p.add_argument("--robot", required=True, help="robot name: keys are reflex/<robot>/...")
    p.add_argument("--env-kwargs", default="{}", help="JSON object passed to the environment's constructor")
    p.add_argument("--success-key", action="append", default=None,
                   help=f"info key that reports success (repeatable; default {', '.join(DEFAULT_SUCCESS_KEYS)})")
    p.add_argument("--intervention-key", default=None,
                   help="info key under which the environment reports a person's action (a takeover)")
    p.add_argument("--listen", action="append", default=[], help="Zenoh endpoint to listen on (repeatable)")
    p.add_argument("--connect", action="append", default=[], help="Zenoh endpoint to connect to (repeatable)")
    p.add_argument("--no-multicast", action="store_true", help="turn off multicast scouting")
    return p.parse_args()


def open_session(args):
    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    if args.listen:
        conf.insert_json5("listen/endpoints", json.dumps(args.listen))
    if args.connect:
        conf.insert_json5("connect/endpoints", json.dumps(args.connect))
    if args.no_multicast:
        conf.insert_json5("scouting/multicast/enabled", "false")
    return zenoh.open(conf)


def main():
    args = parse_args()
    try:
        kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--env-kwargs: not JSON ({e}): {args.env_kwargs}")
    if not isinstance(kwargs, dict):
        raise SystemExit(f"--env-kwargs: a JSON object is needed, got {args.env_kwargs}")
    env = gym.make(args.env, **kwargs)
    layout = Layout(env.observation_space, args.env)
    spec = make_spec(env, args.robot, args.env, layout)
    success_keys = args.success_key or DEFAULT_SUCCESS_KEYS
    n_act = len(spec["action"]["names"])
    keys = {k: f"reflex/{args.robot}/{k}" for k in ["obs", "cmd", "spec", "reset", "events", "teleop"]}
    session = open_session(args)

    spec_bytes = pack(spec)
    state = {"episode": 0, "step": 0, "seq": 0, "seed": None, "person": False, "teleop_seq": 0}
    # Zenoh calls back on its own threads; one lock keeps the environment single-threaded and
    # handles resets and commands in arrival order.
    lock = threading.Lock()

    def obs_msg(obs, reward, terminated, truncated, info):
        return {
            "v": PROTOCOL_VERSION,
            "seq": state["seq"],
            "episode": state["episode"],
            "step": state["step"],
            "time_ns": int(round(state["step"] / spec["control_hz"] * 1e9)),
            "state": layout.state(obs),
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "success": success_of(info, success_keys),
            "images": layout.images(obs),
        }

    def event(kind):
        events_pub.put(pack({"v": PROTOCOL_VERSION, "kind": kind, "episode": state["episode"],
                             "step": state["step"], "seed": state["seed"], "source": "robot"}))

    def relay_person(info):
        """The environment's own teleoperation, as reflex teleop messages."""
        if args.intervention_key is None:
            return
        action = info.get(args.intervention_key)
        person = action is not None
        if not person and not state["person"]:
            return
        state["teleop_seq"] += 1
        state["person"] = person
        teleop_pub.put(pack({
            "v": PROTOCOL_VERSION, "seq": state["teleop_seq"],
            "action": f32_list(action) if person else [0.0] * n_act,
            "intervene": person, "success": False, "failure": False, "reset": False,
        }))

    def on_reset(query):
        payload = query.payload.to_bytes() if query.payload is not None else b""
        seed = None
        if payload:
            req = msgpack.unpackb(payload)
            if req.get("v") != PROTOCOL_VERSION:
                query.reply_err(pack(f"reset request has protocol version {req.get('v')}, the bridge speaks {PROTOCOL_VERSION}"))
                return
            seed = req.get("seed")
        with lock:
            obs, info = env.reset(seed=seed)
            state.update(episode=state["episode"] + 1, step=0, seed=seed)
            # The takeover first: the actor reads it before it acts on the observation.
            relay_person(info)
            query.reply(keys["reset"], pack(obs_msg(obs, 0.0, False, False, info)))
            event("reset")

    def on_cmd(sample):
        cmd = msgpack.unpackb(sample.payload.to_bytes())
        if cmd.get("v") != PROTOCOL_VERSION or len(cmd.get("action", [])) != n_act:
            print(f"ignoring bad command on {keys['cmd']}: {cmd}", file=sys.stderr, flush=True)
            return
        with lock:
            action = np.asarray(cmd["action"], dtype=np.float32).reshape(env.action_space.shape)
            obs, reward, terminated, truncated, info = env.step(action)
            state["seq"] = cmd["seq"]
            state["step"] += 1
            relay_person(info)
            obs_pub.put(pack(obs_msg(obs, reward, terminated, truncated, info)))
            if terminated or truncated:
                event("done")

    obs_pub = session.declare_publisher(keys["obs"], express=True)
    events_pub = session.declare_publisher(keys["events"])
    teleop_pub = session.declare_publisher(keys["teleop"], express=True)
    session.declare_queryable(keys["spec"], lambda q: q.reply(keys["spec"], spec_bytes))
    session.declare_queryable(keys["reset"], on_reset)
    session.declare_subscriber(keys["cmd"], on_cmd)
    token = session.liveliness().declare_token(f"reflex/{args.robot}/alive/robot")
    print(f"serving {args.env} as robot `{args.robot}` on reflex/{args.robot}/*", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    token.undeclare()
    session.close()


if __name__ == "__main__":
    main()
