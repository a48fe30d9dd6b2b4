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

Threads: the environment lives on the thread that created it (the main thread), and every call
into it (`reset`, `step`) is made there. Zenoh's callbacks only check what arrived and queue it.
Rendering environments need that: MuJoCo's EGL or OSMesa context, like most OpenGL contexts,
belongs to the thread that made it, and a `step` on another thread fails (EGL_BAD_ACCESS).

Nothing is lost silently: observations go out reliably with blocking congestion control (a slow
link makes the bridge wait, it never drops one), and a command that arrives again with the
number of the last one executed (the controller heard no answer: the observation was lost on
the way) is answered with that observation again, without stepping; both are counted and logged.
A reset the environment refuses is answered with its error, which the controller shows; an
exception in `step` ends the bridge (the environment is in an unknown state), so the controller
sees the robot leave the bus instead of waiting for an answer that will never come.

Requirements: gymnasium, eclipse-zenoh (same version as reflex's zenoh crate), msgpack, numpy.
"""

import argparse
import json
import math
import queue
import signal
import sys
import time
import traceback

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


class Counter:
    """Messages of one kind (refused, repeated), counted and logged at most once a second, so a
    flood cannot flood the log."""

    def __init__(self, what):
        self.what = what
        self.count = 0
        self.last_log = -math.inf

    def add(self, why):
        self.count += 1
        now = time.monotonic()
        if now - self.last_log >= 1.0:
            self.last_log = now
            print(f"{self.what} ({self.count} so far): {why}", file=sys.stderr, flush=True)


# Commands and resets waiting for the environment's thread. A controller in lockstep has one
# command in flight; the bound only stops a flood from growing memory without end.
INBOX = 256
# How often the environment's thread looks up from an empty inbox (Ctrl-C, SIGTERM).
IDLE_S = 0.5


class Stop(Exception):
    """SIGTERM: end like Ctrl-C, withdrawing the liveliness token."""


def main():
    args = parse_args()
    try:
        kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--env-kwargs: not JSON ({e}): {args.env_kwargs}")
    if not isinstance(kwargs, dict):
        raise SystemExit(f"--env-kwargs: a JSON object is needed, got {args.env_kwargs}")
    # This thread makes the environment, so every call into it is made from here (see the top).
    env = gym.make(args.env, **kwargs)
    layout = Layout(env.observation_space, args.env)
    spec = make_spec(env, args.robot, args.env, layout)
    success_keys = args.success_key or DEFAULT_SUCCESS_KEYS
    n_act = len(spec["action"]["names"])
    keys = {k: f"reflex/{args.robot}/{k}" for k in ["obs", "cmd", "spec", "reset", "events", "teleop"]}
    session = open_session(args)

    spec_bytes = pack(spec)
    # Touched by the environment's thread only.
    # seq: the last command executed; last_obs: its observation, encoded (None after a reset:
    # a repeat of a command from the previous episode is stale, not lost).
    state = {"episode": 0, "step": 0, "seq": 0, "seed": None, "person": False, "teleop_seq": 0,
             "last_obs": None}
    inbox = queue.Queue(maxsize=INBOX)
    refused = Counter(f"refused a command on {keys['cmd']}")
    repeated = Counter(f"answered a command on {keys['cmd']} again (its observation was lost on the way)")
    stale = Counter(f"ignored a command on {keys['cmd']} from before the last reset")

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

    # Zenoh's threads: check and queue, never touch the environment.
    def on_reset(query):
        payload = query.payload.to_bytes() if query.payload is not None else b""
        seed = None
        try:
            if payload:
                req = msgpack.unpackb(payload)
                if not isinstance(req, dict) or req.get("v") != PROTOCOL_VERSION:
                    v = req.get("v") if isinstance(req, dict) else None
                    raise ValueError(f"reset request on {keys['reset']} has protocol version {v}, "
                                     f"the bridge speaks {PROTOCOL_VERSION}")
                seed = req.get("seed")
                if seed is not None and (not isinstance(seed, int) or seed < 0):
                    raise ValueError(f"reset request on {keys['reset']}: seed {seed!r} is not an unsigned integer")
            inbox.put_nowait(("reset", query, seed))
        except queue.Full:
            query.reply_err(f"robot `{args.robot}` is busy: {INBOX} requests wait for the environment; retry")
            query.drop()
        except (ValueError, msgpack.UnpackException, TypeError) as e:
            query.reply_err(str(e))
            query.drop()

    def on_cmd(sample):
        try:
            cmd = msgpack.unpackb(sample.payload.to_bytes())
        except (ValueError, msgpack.UnpackException) as e:
            refused.add(f"not MessagePack: {e}")
            return
        if not isinstance(cmd, dict) or cmd.get("v") != PROTOCOL_VERSION:
            refused.add(f"not a protocol version {PROTOCOL_VERSION} command: {str(cmd)[:200]}")
            return
        seq, action = cmd.get("seq"), cmd.get("action")
        if not isinstance(seq, int) or seq < 0:
            refused.add(f"command without an unsigned `seq`: {str(cmd)[:200]}")
            return
        if (not isinstance(action, list) or len(action) != n_act
                or not all(isinstance(a, (int, float)) and math.isfinite(a) for a in action)):
            refused.add(f"command {seq}: the action is not {n_act} finite numbers: {str(action)[:200]}")
            return
        try:
            inbox.put_nowait(("cmd", seq, action))
        except queue.Full:
            refused.add(f"command {seq}: {INBOX} requests wait for the environment already")

    # The environment's thread (this one).
    def do_reset(query, seed):
        try:
            try:
                obs, info = env.reset(seed=seed)
            except Exception as e:  # the environment's own error, handed to the controller
                traceback.print_exc()
                query.reply_err(f"robot `{args.robot}`: the environment's reset(seed={seed}) raised "
                                f"{type(e).__name__}: {e} (the bridge's log has the traceback)")
                return
            state.update(episode=state["episode"] + 1, step=0, seed=seed, last_obs=None)
            # The takeover first: the actor reads it before it acts on the observation.
            relay_person(info)
            query.reply(keys["reset"], pack(obs_msg(obs, 0.0, False, False, info)))
            event("reset")
        finally:
            query.drop()

    def do_cmd(seq, action):
        if seq == state["seq"]:
            # The controller sends a command again only when no observation answered it.
            if state["last_obs"] is not None:
                repeated.add(f"command {seq}: sent its observation again")
                obs_pub.put(state["last_obs"])
            else:
                stale.add(f"command {seq} was the last one before the reset")
            return
        a = np.asarray(action, dtype=np.float32).reshape(env.action_space.shape)
        try:
            obs, reward, terminated, truncated, info = env.step(a)
        except Exception:
            traceback.print_exc()
            raise SystemExit(f"the environment's step() raised on command {seq} (traceback above); "
                             "the bridge stops: its state is unknown")
        state["seq"] = seq
        state["step"] += 1
        relay_person(info)
        state["last_obs"] = pack(obs_msg(obs, reward, terminated, truncated, info))
        obs_pub.put(state["last_obs"])
        if terminated or truncated:
            event("done")

    # Observations are large (camera images) and each one answers a command: block rather than
    # drop when the link is congested.
    obs_pub = session.declare_publisher(keys["obs"], express=True,
                                        congestion_control=zenoh.CongestionControl.BLOCK,
                                        reliability=zenoh.Reliability.RELIABLE)
    events_pub = session.declare_publisher(keys["events"], congestion_control=zenoh.CongestionControl.BLOCK)
    teleop_pub = session.declare_publisher(keys["teleop"], express=True,
                                           congestion_control=zenoh.CongestionControl.BLOCK)
    session.declare_queryable(keys["spec"], lambda q: q.reply(keys["spec"], spec_bytes))
    session.declare_queryable(keys["reset"], on_reset)
    session.declare_subscriber(keys["cmd"], on_cmd)
    token = session.liveliness().declare_token(f"reflex/{args.robot}/alive/robot")

    def on_term(_sig, _frame):
        raise Stop()

    signal.signal(signal.SIGTERM, on_term)
    print(f"serving {args.env} as robot `{args.robot}` on reflex/{args.robot}/*", file=sys.stderr, flush=True)
    try:
        while True:
            try:
                item = inbox.get(timeout=IDLE_S)
            except queue.Empty:
                continue
            if item[0] == "reset":
                do_reset(item[1], item[2])
            else:
                do_cmd(item[1], item[2])
    except (KeyboardInterrupt, Stop):
        pass
    finally:
        print(f"bridge for `{args.robot}` ends: {repeated.count} commands answered again, "
              f"{refused.count} refused, {stale.count} stale", file=sys.stderr, flush=True)
        token.undeclare()
        session.close()


if __name__ == "__main__":
    main()
