"""A ROS 2 node's view of a reflex robot, written from rmw_zenoh's design document
(ros2/rmw_zenoh docs/design.md: key expressions, the 33-byte attachment, liveliness tokens) and
PyPI `rosbags` (message definitions, CDR, RIHS01 type hashes), with no reflex code and no ROS 2
installation.

It connects to reflex's Zenoh endpoint, reads the ROS 2 graph from the liveliness tokens, checks
every type hash against rosbags' own, decodes the joint states, TF, camera images, camera info
and diagnostics, then acts as a ROS 2 teleop node: drives the arm with TwistStamped, stops, sends
an e-stop without an attachment (which a ROS 2 subscriber would drop), `false`, then `true`, then
`false` again, then `true` twice more (repeats, counted), and checks that the robot's joint
states, TF and images keep coming while the e-stop is latched, with diagnostics saying it is
stopped. It prints a JSON summary; any failed check exits non-zero with the reason.
"""

import argparse
import json
import xml.etree.ElementTree as ET
import math
import struct
import sys
import threading
import time

import zenoh
from rosbags.typesys import Stores, get_typestore

TS = get_typestore(Stores.ROS2_JAZZY)


def fail(why):
    print(f"ros2_peer: {why}", file=sys.stderr)
    sys.exit(1)


def dds_name(ros_type):
    pkg, kind, name = ros_type.split("/")
    return f"{pkg}::{kind}::dds_::{name}_"


def ros_type(dds):
    pkg, kind, _, name = dds.split("::")
    return f"{pkg}/{kind}/{name[:-1]}"


def data_key(domain, topic, typ):
    return f"{domain}/{topic.strip('/')}/{dds_name(typ)}/{TS.hash_rihs01(typ)}"


def attachment(seq, gid):
    return struct.pack("<qq", seq, time.time_ns()) + bytes([16]) + gid


class Peer:
    def __init__(self, args):
        conf = zenoh.Config()
        conf.insert_json5("mode", '"peer"')
        conf.insert_json5("connect/endpoints", json.dumps([args.connect]))
        conf.insert_json5("scouting/multicast/enabled", "false")
        self.s = zenoh.open(conf)
        self.args = args
        self.d = args.domain
        self.lock = threading.Lock()
        self.tokens = set()
        self.samples = {}
        self.subs = []
        self.errors = []
        self.live = self.s.liveliness().declare_subscriber(
            f"@ros2_lv/{self.d}/**", self.on_token, history=True
        )

    def on_token(self, sample):
        with self.lock:
            k = str(sample.key_expr)
            if sample.kind == zenoh.SampleKind.PUT:
                self.tokens.add(k)
            else:
                self.tokens.discard(k)

    def wait(self, what, ok, secs=60):
        t0 = time.monotonic()
        while True:
            with self.lock:
                if self.errors:
                    fail(self.errors[0])
                if ok():
                    return
            if time.monotonic() - t0 > secs:
                fail(f"never happened: {what}")
            time.sleep(0.02)

    def subscribe(self, topic, typ):
        key = data_key(self.d, topic, typ)
        got = self.samples.setdefault(key, [])

        def on(sample):
            # Zenoh's thread: a failure is reported by the next wait().
            try:
                if sample.attachment is None:
                    raise ValueError("a sample without an attachment")
                b = sample.attachment.to_bytes()
                if len(b) != 33 or b[16] != 16:
                    raise ValueError(f"attachment of {len(b)} bytes: {b.hex()}")
                seq, stamp = struct.unpack_from("<qq", b)
                msg = TS.deserialize_cdr(sample.payload.to_bytes(), typ)
                with self.lock:
                    got.append(((seq, stamp, bytes(b[17:])), msg, time.time_ns()))
            except Exception as e:  # noqa: BLE001 - any decoding failure fails the run
                with self.lock:
                    self.errors.append(f"{key}: {e!r}")

        self.subs.append(self.s.declare_subscriber(key, on))
        return got

    def count(self, got):
        with self.lock:
            return len(got)


def parse_token(tok):
    parts = tok.split("/")
    if len(parts) not in (9, 13) or parts[0] != "@ros2_lv":
        fail(f"token {tok} has {len(parts)} parts")
    d = {
        "domain": parts[1],
        "zid": parts[2],
        "nid": parts[3],
        "eid": parts[4],
        "kind": parts[5],
        "enclave": parts[6].replace("%", "/"),
        "namespace": parts[7].replace("%", "/"),
        "node": parts[8],
    }
    if len(parts) == 13:
        d.update(
            topic=parts[9].replace("%", "/"),
            type=parts[10],
            hash=parts[11],
            qos=parts[12],
        )
    return d


def check_sequence(key, got):
    """Per publisher GID, sequence numbers go up by one; source stamps are now-ish."""
    by_gid = {}
    for (seq, stamp, gid), _, recv in got:
        by_gid.setdefault(gid, []).append(seq)
        if abs(recv - stamp) > 60e9:
            fail(f"{key}: source timestamp {stamp} is {abs(recv - stamp) / 1e9:.0f} s from now")
    if len(by_gid) != 1:
        fail(f"{key}: {len(by_gid)} publishers")
    seqs = next(iter(by_gid.values()))
    for a, b in zip(seqs, seqs[1:]):
        if b != a + 1:
            fail(f"{key}: sequence {a} then {b}")
    return seqs[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True)
    ap.add_argument("--domain", type=int, default=0)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--node", default="reflex")
    ap.add_argument("--joints", required=True, help="comma-separated")
    ap.add_argument("--cameras", default="", help="comma-separated")
    ap.add_argument("--base-frame", required=True)
    ap.add_argument("--robot", required=True)
    args = ap.parse_args()
    p = Peer(args)
    ns = args.namespace
    cams = [c for c in args.cameras.split(",") if c]
    out = {}

    # 1. The graph: reflex's node and every topic it publishes or takes, with ROS 2's hashes.
    pubs = {
        f"{ns}/joint_states": "sensor_msgs/msg/JointState",
        "/tf": "tf2_msgs/msg/TFMessage",
        "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray",
        f"{ns}/robot_description": "std_msgs/msg/String",
    }
    for c in cams:
        pubs[f"{ns}/{c}/image_raw"] = "sensor_msgs/msg/Image"
        pubs[f"{ns}/{c}/camera_info"] = "sensor_msgs/msg/CameraInfo"
    subs = {f"{ns}/estop": "std_msgs/msg/Bool", f"{ns}/servo/twist": "geometry_msgs/msg/TwistStamped"}

    def entities():
        return [parse_token(t) for t in p.tokens]

    def graph_complete():
        es = entities()
        nodes = [e for e in es if e["kind"] == "NN" and e["node"] == args.node and e["namespace"] == ns]
        have = {(e["kind"], e["topic"]) for e in es if "topic" in e and e["node"] == args.node}
        want = {("MP", t) for t in pubs} | {("MS", t) for t in subs}
        return len(nodes) == 1 and want <= have

    p.wait("reflex's node and its publishers and subscriptions in the ROS 2 graph", graph_complete)
    with p.lock:
        es = entities()
    for e in es:
        if "topic" not in e or e["node"] != args.node:
            continue
        typ = ros_type(e["type"])
        want = (pubs if e["kind"] == "MP" else subs).get(e["topic"])
        if want != typ:
            fail(f"{e['topic']} has type {typ}, expected {want}")
        if e["hash"] != TS.hash_rihs01(typ):
            fail(f"{typ}: hash {e['hash']} but ROS 2's is {TS.hash_rihs01(typ)}")
        if e["enclave"] != "/" or e["nid"] != "0":
            fail(f"token fields {e}")
    out["graph"] = sorted(f"{e['kind']} {e.get('topic', e['namespace'] + '/' + e['node'])}" for e in es)

    # 2. The data, decoded with rosbags.
    got = {t: p.subscribe(t, typ) for t, typ in pubs.items()}
    need = {t: 2 for t in pubs}
    need[f"{ns}/joint_states"] = 5
    need["/tf"] = 5
    p.wait(
        "samples on every topic",
        lambda: all(len(got[t]) >= n for t, n in need.items()),
    )
    with p.lock:
        snap = {t: list(v) for t, v in got.items()}
    joints = args.joints.split(",")
    for t, v in snap.items():
        check_sequence(t, v)
    js = [m for _, m, _ in snap[f"{ns}/joint_states"]]
    for m in js:
        if list(m.name) != joints:
            fail(f"joint names {list(m.name)}, expected {joints}")
        if len(m.position) != len(joints) or len(m.velocity) != len(joints):
            fail(f"{len(m.position)} positions, {len(m.velocity)} velocities for {len(joints)} joints")
        if not all(math.isfinite(x) for x in m.position):
            fail(f"positions {m.position}")
    out["joint_position"] = [float(x) for x in js[-1].position]
    tf = snap["/tf"][-1][1]
    frames = {}
    for tr in tf.transforms:
        q = tr.transform.rotation
        n = math.sqrt(q.x**2 + q.y**2 + q.z**2 + q.w**2)
        if abs(n - 1) > 1e-6:
            fail(f"TF {tr.header.frame_id}->{tr.child_frame_id}: quaternion norm {n}")
        frames[tr.child_frame_id] = tr.header.frame_id
    roots = {parent for parent in frames.values() if parent not in frames}
    if roots != {args.base_frame}:
        fail(f"TF tree roots {roots}, expected {args.base_frame}: {frames}")
    out["tf_frames"] = frames
    # Every link of the robot's model is in the tree (what RViz's robot model needs).
    urdf = snap[f"{ns}/robot_description"][-1][1].data
    links = {l.get("name") for l in ET.fromstring(urdf).iter("link")}
    missing = links - set(frames) - roots
    if missing:
        fail(f"links of robot_description missing from TF: {sorted(missing)}")
    out["urdf_links"] = len(links)
    for c in cams:
        img = snap[f"{ns}/{c}/image_raw"][-1][1]
        info = snap[f"{ns}/{c}/camera_info"][-1][1]
        if img.encoding != "rgb8" or img.step != 3 * img.width or len(img.data) != img.step * img.height:
            fail(f"{c}: image {img.width}x{img.height} {img.encoding} step {img.step}, {len(img.data)} bytes")
        if (info.width, info.height) != (img.width, img.height) or info.k[8] != 1.0:
            fail(f"{c}: camera info {info.width}x{info.height} k {list(info.k)}")
        if img.header.frame_id != info.header.frame_id:
            fail(f"{c}: image frame {img.header.frame_id}, info frame {info.header.frame_id}")
        out.setdefault("images", {})[c] = [img.width, img.height, img.header.frame_id, int(sum(int(x) for x in img.data))]
    diag_key = "/diagnostics"

    def diag_values(m):
        vals = {}
        for st in m.status:
            vals[st.name] = (st.level, st.message, {kv.key: kv.value for kv in st.values})
        return vals

    loop_name = f"reflex: {args.robot} control loop"
    stop_name = f"reflex: {args.robot} e-stop"
    d = diag_values(snap[diag_key][-1][1])
    if loop_name not in d or stop_name not in d:
        fail(f"diagnostics {list(d)}")
    if d[stop_name][0] != 0:
        fail(f"e-stop before anything: {d[stop_name]}")

    def next_diag(after, what, ok, secs=60):
        found = []

        def check():
            for _, m, recv in got[diag_key]:
                if recv > after:
                    v = diag_values(m)
                    if ok(v):
                        found.append((recv, v))
                        return True
            return False

        p.wait(what, check, secs)
        return found[0]

    # 3. A ROS 2 teleop node: its own node and publisher tokens, then twists at 50 Hz.
    zid = str(p.s.zid())
    me = f"@ros2_lv/{args.domain}/{zid}/0"
    tokens = [p.s.liveliness().declare_token(f"{me}/0/NN/%/%/teleop_peer")]
    pubkeys = {}
    for i, (topic, typ) in enumerate(subs.items(), start=1):
        tokens.append(
            p.s.liveliness().declare_token(
                f"{me}/{i}/MP/%/%/teleop_peer/{topic.replace('/', '%')}/{dds_name(typ)}/{TS.hash_rihs01(typ)}/::,10:,:,:,,"
            )
        )
        pubkeys[topic] = (data_key(args.domain, topic, typ), typ, bytes(range(i, i + 16)), [0])

    def publish(topic, msg, with_attachment=True):
        key, typ, gid, seq = pubkeys[topic]
        seq[0] += 1
        payload = bytes(TS.serialize_cdr(msg, typ))
        p.s.put(key, payload, attachment=attachment(seq[0], gid) if with_attachment else None)

    Time = TS.types["builtin_interfaces/msg/Time"]
    Header = TS.types["std_msgs/msg/Header"]
    Vector3 = TS.types["geometry_msgs/msg/Vector3"]
    Twist = TS.types["geometry_msgs/msg/Twist"]
    TwistStamped = TS.types["geometry_msgs/msg/TwistStamped"]
    Bool = TS.types["std_msgs/msg/Bool"]

    def twist(vx):
        now = time.time_ns()
        return TwistStamped(
            header=Header(stamp=Time(sec=now // 10**9, nanosec=now % 10**9), frame_id=args.base_frame),
            twist=Twist(linear=Vector3(x=vx, y=0.0, z=0.0), angular=Vector3(x=0.0, y=0.0, z=0.0)),
        )

    before = js[-1].position.copy()
    t0 = time.time_ns()
    stop_twisting = threading.Event()

    def stream():
        while not stop_twisting.is_set():
            publish(f"{ns}/servo/twist", twist(0.05))
            time.sleep(0.02)

    th = threading.Thread(target=stream)
    th.start()
    try:
        next_diag(t0, "the loop intervening under the twist", lambda v: v[loop_name][2].get("intervening") == "true")
        # The arm moves while the twists come.
        t1 = time.time_ns()
        p.wait(
            "the joints moving under the twist",
            lambda: any(
                recv > t1 and max(abs(a - b) for a, b in zip(m.position, before)) > 1e-3
                for _, m, recv in got[f"{ns}/joint_states"]
            ),
        )
    finally:
        stop_twisting.set()
        th.join()
    t2 = time.time_ns()
    next_diag(t2, "the robot handed back when the twists stop", lambda v: v[loop_name][2].get("intervening") == "false")
    out["twist"] = "taken and released"

    # 4. An e-stop with no attachment: a ROS 2 subscriber drops it, and so does reflex (counted).
    estop_key = pubkeys[f"{ns}/estop"][0]
    t3 = time.time_ns()
    publish(f"{ns}/estop", Bool(data=True), with_attachment=False)
    _, v = next_diag(
        t3,
        "the attachment-less e-stop counted as rejected",
        lambda v: v[loop_name][2].get(f"rejected.{estop_key}") == "1",
    )
    if v[stop_name][0] != 0:
        fail(f"an e-stop without an attachment was taken: {v[stop_name]}")
    # 5. `false` releases nothing and raises nothing; `true` latches; `false` again does not release.
    publish(f"{ns}/estop", Bool(data=False))
    t4 = time.time_ns()
    publish(f"{ns}/estop", Bool(data=True))
    _, v = next_diag(t4, "the e-stop latched from ROS 2", lambda v: v[stop_name][0] == 2)
    out["estop"] = list(v[stop_name][:2])
    publish(f"{ns}/estop", Bool(data=False))
    t5 = time.time_ns()
    p.wait("two more diagnostics", lambda: sum(recv > t5 for _, _, recv in got[diag_key]) >= 2)
    with p.lock:
        seen = [diag_values(m)[stop_name] for _, m, recv in got[diag_key] if recv > t5]
    if any(s[0] != 2 for s in seen):
        fail(f"a ROS 2 `false` released the e-stop: {seen}")
    out["estop_after_false"] = [list(s[:2]) for s in seen]

    # 6. An e-stop node that repeats `true` while latched: counted, not warned again (the test
    #    counts reflex's warnings).
    publish(f"{ns}/estop", Bool(data=True))
    publish(f"{ns}/estop", Bool(data=True))
    t6 = time.time_ns()
    _, v = next_diag(
        t6,
        "the repeated e-stops counted in the diagnostics",
        lambda v: v[stop_name][2].get("ros2_estop_repeats") == "2",
    )
    out["estop_repeats"] = int(v[stop_name][2]["ros2_estop_repeats"])

    # 7. While it is latched, the robot does not vanish: joint states, TF, both cameras' images
    #    and camera info keep coming (from the loop's held ticks), and the diagnostics say it is
    #    stopped. Counted from a diagnostic that already reports held joint states and images.
    t7, v = next_diag(
        time.time_ns(),
        "diagnostics reporting the held robot published",
        lambda v: int(v[stop_name][2].get("held_joint_states", "0")) > 0
        and int(v[stop_name][2].get("held_images", "0")) > 0,
    )
    held_need = {f"{ns}/joint_states": 5, "/tf": 5}
    for c in cams:
        held_need[f"{ns}/{c}/image_raw"] = 2
        held_need[f"{ns}/{c}/camera_info"] = 2
    p.wait(
        "joint states, TF and images while the e-stop is latched",
        lambda: all(sum(recv > t7 for _, _, recv in got[t]) >= n for t, n in held_need.items()),
    )
    t8 = time.time_ns()
    _, v = next_diag(t8, "a diagnostic after the held samples", lambda v: True)
    if v[stop_name][0] != 2 or v[loop_name][2].get("stopped") != "true" or not v[loop_name][1].startswith("stopped"):
        fail(f"the robot's topics flowed, but the diagnostics do not say it is stopped: {v}")
    with p.lock:
        snap = {t: list(got[t]) for t in held_need}
    for t, v_ in snap.items():
        check_sequence(t, v_)
    held_js = [m for _, m, recv in snap[f"{ns}/joint_states"] if recv > t7]
    for m in held_js:
        if list(m.name) != joints or not all(math.isfinite(x) for x in m.position):
            fail(f"a held joint state {list(m.name)} {list(m.position)}")
    held_tf = [m for _, m, recv in snap["/tf"] if recv > t7]
    if {tr.child_frame_id for tr in held_tf[-1].transforms} != set(frames):
        fail(f"a held TF lacks frames: {[tr.child_frame_id for tr in held_tf[-1].transforms]}")
    out["held"] = {
        t: sum(recv > t7 for _, _, recv in snap[t]) for t in held_need
    }
    out["held_diagnostics"] = [v[loop_name][1], v[stop_name][1]]
    del tokens
    print(json.dumps(out))
    sys.stdout.flush()
    p.s.close()


if __name__ == "__main__":
    main()
