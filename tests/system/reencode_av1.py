"""Re-encodes a LeRobotDataset's videos as LeRobot writes them by default: AV1 by FFmpeg's
libsvtav1 (LeRobot's encode_video_frames: yuv420p, g=2, crf=30), each frame at its time, and
sets `video.codec` to "av1" in meta/info.json. The test-side peer that makes an AV1 dataset
without LeRobot itself (PyAV's bundled FFmpeg).

    reencode_av1.py DATASET_DIR

Prints {"files": N, "frames": M}.
"""

import json
import pathlib
import sys

import av


def reencode(path):
    src = av.open(str(path))
    stream = src.streams.video[0]
    rate = stream.average_rate
    frames = [f.to_ndarray(format="rgb24") for f in src.decode(video=0)]
    times = [f for f in av.open(str(path)).decode(video=0)]
    src.close()
    tmp = path.with_suffix(".av1.mp4")
    with av.open(str(tmp), "w") as out:
        s = out.add_stream("libsvtav1", rate=rate, options={"g": "2", "crf": "30", "preset": "12"})
        s.height, s.width = frames[0].shape[:2]
        s.pix_fmt = "yuv420p"
        s.time_base = 1 / rate
        for k, (f, t) in enumerate(zip(frames, times)):
            frame = av.VideoFrame.from_ndarray(f, format="rgb24")
            frame.pts = round(float(t.time) * rate)
            for p in s.encode(frame):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    tmp.replace(path)
    return len(frames)


def main():
    root = pathlib.Path(sys.argv[1])
    files = sorted((root / "videos").rglob("*.mp4"))
    frames = sum(reencode(p) for p in files)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    for feature in info["features"].values():
        if feature.get("dtype") == "video":
            feature["info"]["video.codec"] = "av1"
    info_path.write_text(json.dumps(info, indent=4))
    print(json.dumps({"files": len(files), "frames": frames}))


if __name__ == "__main__":
    main()
