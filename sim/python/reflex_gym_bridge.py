#!/usr/bin/env python3
"""Serve any Gymnasium environment as a reflex robot over Zenoh.

The environment answers the reflex robot protocol (docs/protocol.md) under `reflex/<robot>/...`:
`spec` and `reset` queries, `cmd` -> `obs` in lockstep, episode `events`, and a liveliness token on
`reflex/<robot>/alive/robot`. reflex (or anything else that speaks the protocol) can then drive it
exactly like the built-in simulator or a real arm:

    python sim/python/reflex_gym_bridge.py --env Pendulum-v1 --robot pendulum \
        --listen tcp/127.0.0.1:7447 --no-multicast

Requirements: gymnasium, eclipse-zenoh (same version as reflex's zenoh crate), msgpack, numpy.
Observations are flattened to one float32 vector; actions must be a gymnasium `Box`.
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


def pack(msg):
    # float32 on the wire, like reflex: values round-trip bit-exactly.
    return msgpack.packb(msg, use_single_float=True)


def flatten(space, obs):
    return [float(x) for x in np.asarray(gym.spaces.flatten(space, obs), dtype=np.float32).ravel()]


def make_spec(env, robot, env_id):
    act = env.action_space
    if not isinstance(act, gym.spaces.Box):
        raise SystemExit(f"{env_id}: action space {act} is not a gymnasium Box; reflex drives continuous actions")
    n_obs = int(gym.spaces.flatdim(env.observation_space))
    n_act = int(np.prod(act.shape))
    max_steps = env.spec.max_episode_steps if env.spec is not None and env.spec.max_episode_steps else 0
    return {
        "v": PROTOCOL_VERSION,
        "name": robot,
        "kind": f"gym/{env_id}",
        "control_hz": float(env.metadata.get("render_fps", 30) or 30),
        "lockstep": True,
        "state": [{"name": "obs", "size": n_obs, "unit": f"{env_id} observation, flattened"}],
        "action": {
            "kind": "box",
            "names": [f"a{i}" for i in range(n_act)],
            "low": [float(x) for x in np.asarray(act.low, dtype=np.float32).ravel()],
            "high": [float(x) for x in np.asarray(act.high, dtype=np.float32).ravel()],
        },
        "cameras": [],
        "joints": [],
        "max_episode_steps": int(max_steps),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="Gymnasium environment id, e.g. Pendulum-v1")
    p.add_argument("--robot", required=True, help="robot name: keys are reflex/<robot>/...")
    p.add_argument("--listen", action="append", default=[], help="Zenoh endpoint to listen on (repeatable)")
    p.add_argument("--connect", action="append", default=[], help="Zenoh endpoint to connect to (repeatable)")
    p.add_argument("--no-multicast", action="store_true", help="turn off multicast scouting")
    args = p.parse_args()

    env = gym.make(args.env)
    spec = make_spec(env, args.robot, args.env)
    n_act = len(spec["action"]["names"])
    keys = {k: f"reflex/{args.robot}/{k}" for k in ["obs", "cmd", "spec", "reset", "events"]}

    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    if args.listen:
        conf.insert_json5("listen/endpoints", json.dumps(args.listen))
    if args.connect:
        conf.insert_json5("connect/endpoints", json.dumps(args.connect))
    if args.no_multicast:
        conf.insert_json5("scouting/multicast/enabled", "false")
    session = zenoh.open(conf)

    spec_bytes = pack(spec)
    state = {"episode": 0, "step": 0, "seq": 0, "seed": None}
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
            "state": flatten(env.observation_space, obs),
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "success": bool(info.get("is_success", False)),
            "images": [],
        }

    def event(kind):
        events_pub.put(pack({"v": PROTOCOL_VERSION, "kind": kind, "episode": state["episode"],
                             "step": state["step"], "seed": state["seed"], "source": "robot"}))

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
            obs_pub.put(pack(obs_msg(obs, reward, terminated, truncated, info)))
            if terminated or truncated:
                event("done")

    obs_pub = session.declare_publisher(keys["obs"], express=True)
    events_pub = session.declare_publisher(keys["events"])
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
