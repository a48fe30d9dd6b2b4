"""OpenCV as the reference for reflex's camera calibration, on the corners reflex detected.

    opencv_calibration.py intrinsics CORNERS.json CAMERA.yaml
        cv2.calibrateCamera on the corners (OpenCV's default model: k1, k2, p1, p2, k3); reflex's
        camera file read back with cv2.FileStorage (the file must be OpenCV's layout).
    opencv_calibration.py hand-eye CORNERS.json CAMERA.yaml REPORT.json
        each view's board pose by cv2.solvePnP with the camera file's intrinsics, the gripper's
        pose from reflex's report (forward kinematics), then cv2.calibrateHandEye (Park-Martin
        and Tsai-Lenz).
    opencv_calibration.py charuco-detect BOARD IMAGE...
        OpenCV's own ChArUco detector (cv2.aruco.CharucoDetector) on images: per image, the ids
        and pixels of the corners it finds, and the board's corners in its frame as OpenCV
        places them (getChessboardCorners).
    opencv_calibration.py charuco-render BOARD OUTDIR VIEWS SEED
        views of a ChArUco board that OpenCV draws itself (CharucoBoard.generateImage), seen
        through a camera OpenCV models (each sample's ray from cv2.undistortPointsIter, 4x4 samples
        a pixel, cv2.remap into the drawing), from seeded poses that keep the whole board in view
        and tilt it about different axes; writes view_NNN.png and truth.json (the camera, every
        pose, and every corner's pixel by cv2.projectPoints): inputs reflex did not make.

A ChArUco board's object points are OpenCV's (cv2.aruco.CharucoBoard.getChessboardCorners,
indexed by corner id), so reflex's board frame is checked too.

Prints one JSON object.
"""

import json
import sys

import cv2
import numpy as np


def charuco_board(board):
    """cv2.aruco.CharucoBoard of a reflex name charuco:SXxSY:SQUARE:MARKER[:DICT]."""
    fields = board.split(":")
    assert fields[0] == "charuco", board
    sx, sy = (int(v) for v in fields[1].split("x"))
    dictionary = fields[4] if len(fields) > 4 else "DICT_4X4_50"
    d = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, dictionary))
    b = cv2.aruco.CharucoBoard((sx, sy), float(fields[2]), float(fields[3]), d)
    b.setLegacyPattern(False)
    return b


def object_points(board):
    """Every corner in the board's frame, indexed by id."""
    if board.startswith("charuco:"):
        return np.array(charuco_board(board).getChessboardCorners(), np.float64).reshape(-1, 3)
    kind, size, square = board.split(":")
    assert kind == "chessboard", board
    cols, rows = (int(v) for v in size.split("x"))
    grid = np.zeros((rows * cols, 3), np.float64)
    for j in range(rows):
        for i in range(cols):
            grid[j * cols + i] = (i * float(square), j * float(square), 0.0)
    return grid


def charuco_detect(board, images):
    b = charuco_board(board)
    detector = cv2.aruco.CharucoDetector(b)
    out = {"opencv": cv2.__version__, "object_points": object_points(board).tolist(), "images": []}
    for path in images:
        gray = cv2.imread(path, cv2.IMREAD_GRAYSCALE)
        assert gray is not None, path
        corners, ids, _, _ = detector.detectBoard(gray)
        found = {"image": path, "ids": [], "corners": []}
        if ids is not None:
            found["ids"] = [int(i) for i in np.asarray(ids).ravel()]
            found["corners"] = np.asarray(corners, np.float64).reshape(-1, 2).tolist()
        out["images"].append(found)
    print(json.dumps(out))


def charuco_render(board, out_dir, views, seed):
    """Renders `views` seeded views of the board OpenCV draws (see the module's doc)."""
    import os

    b = charuco_board(board)
    sx, sy = b.getChessboardSize()
    square = b.getSquareLength()
    # The drawing: 40 px a square and a one-square white margin, pixel centres at integers.
    px = 40
    margin = px
    drawing = b.generateImage((sx * px + 2 * margin, sy * px + 2 * margin), marginSize=margin)
    width, height = 640, 480
    k = np.array([[610.0, 0.0, 322.5], [0.0, 608.0, 236.8], [0.0, 0.0, 1.0]])
    dist = np.array([-0.21, 0.09, 0.0008, -0.0005, -0.02])
    ss = 4
    uu, vv = np.meshgrid(
        np.arange(width * ss, dtype=np.float64) / ss - 0.5 + 0.5 / ss,
        np.arange(height * ss, dtype=np.float64) / ss - 0.5 + 0.5 / ss,
    )
    pts = np.stack([uu.ravel(), vv.ravel()], axis=1).reshape(-1, 1, 2)
    criteria = (cv2.TERM_CRITERIA_COUNT + cv2.TERM_CRITERIA_EPS, 50, 1e-10)
    rays = cv2.undistortPointsIter(pts, k, dist, None, None, criteria).reshape(-1, 2)
    rays = np.concatenate([rays, np.ones((rays.shape[0], 1))], axis=1)
    obj = object_points(board)
    rng = np.random.default_rng(seed)
    centre = np.array([sx * square / 2, sy * square / 2, 0.0])
    os.makedirs(out_dir, exist_ok=True)
    truth = {
        "opencv": cv2.__version__,
        "board": board,
        "image_width": width,
        "image_height": height,
        "camera_matrix": k.tolist(),
        "dist": dist.tolist(),
        "views": [],
    }
    n = 0
    tries = 0
    while n < views:
        tries += 1
        assert tries < 10000, "no pose keeps the board in view"
        tilt = rng.uniform(-0.6, 0.6, 2)
        rvec = np.array([tilt[0], tilt[1], rng.uniform(-0.5, 0.5)])
        r = cv2.Rodrigues(rvec)[0]
        t = np.array([rng.uniform(-0.04, 0.04), rng.uniform(-0.03, 0.03), rng.uniform(0.3, 0.42)])
        t = t - r @ centre
        # The whole board, its margin included, inside the image with 8 px to spare.
        outline = np.array(
            [[-square, -square, 0], [(sx + 1) * square, -square, 0],
             [(sx + 1) * square, (sy + 1) * square, 0], [-square, (sy + 1) * square, 0]]
        )
        edge, _ = cv2.projectPoints(outline, cv2.Rodrigues(r)[0], t, k, dist)
        edge = edge.reshape(-1, 2)
        if not (np.all(edge > 8) and np.all(edge[:, 0] < width - 8) and np.all(edge[:, 1] < height - 8)):
            continue
        # Each ray meets the board's plane: camera centre c and direction d in the board frame.
        c = -r.T @ t
        d = rays @ r  # = (r.T @ rays.T).T
        s = -c[2] / d[:, 2]
        bx = c[0] + s * d[:, 0]
        by = c[1] + s * d[:, 1]
        mx = (margin + bx / square * px - 0.5).astype(np.float32).reshape(height * ss, width * ss)
        my = (margin + by / square * px - 0.5).astype(np.float32).reshape(height * ss, width * ss)
        big = cv2.remap(drawing, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=115)
        img = cv2.resize(big, (width, height), interpolation=cv2.INTER_AREA)
        name = f"view_{n:03d}.png"
        cv2.imwrite(os.path.join(out_dir, name), img)
        corners, _ = cv2.projectPoints(obj, cv2.Rodrigues(r)[0], t, k, dist)
        truth["views"].append(
            {
                "image": name,
                "rvec": cv2.Rodrigues(r)[0].ravel().tolist(),
                "tvec": t.tolist(),
                "corners": corners.reshape(-1, 2).tolist(),
            }
        )
        n += 1
    with open(os.path.join(out_dir, "truth.json"), "w") as f:
        json.dump(truth, f)
    print(json.dumps({"opencv": cv2.__version__, "views": n, "tries": tries}))


def read_camera(path):
    fs = cv2.FileStorage(path, cv2.FILE_STORAGE_READ)
    assert fs.isOpened(), path
    k = fs.getNode("camera_matrix").mat()
    d = fs.getNode("distortion_coefficients").mat()
    size = (int(fs.getNode("image_width").real()), int(fs.getNode("image_height").real()))
    fs.release()
    assert k is not None and d is not None, f"{path}: no camera_matrix or distortion_coefficients"
    return k, d.reshape(-1), size


def quaternion_xyzw(r):
    q = np.empty(4)
    t = np.trace(r)
    if t > 0:
        s = np.sqrt(t + 1.0) * 2
        q[:] = [(r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s, 0.25 * s]
    else:
        i = int(np.argmax(np.diag(r)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = np.sqrt(1.0 + r[i, i] - r[j, j] - r[k, k]) * 2
        q[i] = 0.25 * s
        q[j] = (r[j, i] + r[i, j]) / s
        q[k] = (r[k, i] + r[i, k]) / s
        q[3] = (r[k, j] - r[j, k]) / s
    return list(q / np.linalg.norm(q))


def rotation_from_xyzw(q):
    x, y, z, w = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def main():
    if sys.argv[1] == "charuco-render":
        charuco_render(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    if sys.argv[1] == "charuco-detect":
        charuco_detect(sys.argv[2], sys.argv[3:])
        return
    mode, corners_path, camera_path = sys.argv[1:4]
    corners = json.load(open(corners_path))
    every = object_points(corners["board"])
    views = corners["views"]
    objs = [every[np.array(v["ids"], np.int64)] for v in views]
    img = [np.array(v["corners"], np.float64).reshape(-1, 1, 2).astype(np.float32) for v in views]
    k_reflex, d_reflex, size = read_camera(camera_path)
    assert size == (corners["image_width"], corners["image_height"]), (size, corners["image_width"])
    if mode == "intrinsics":
        criteria = (cv2.TERM_CRITERIA_COUNT + cv2.TERM_CRITERIA_EPS, 200, 1e-12)
        rms, k, d, _, _ = cv2.calibrateCamera(
            [o.astype(np.float32) for o in objs], img, size, None, None, criteria=criteria
        )
        d = d.reshape(-1)
        print(
            json.dumps(
                {
                    "opencv": cv2.__version__,
                    "views": len(img),
                    "rms_px": rms,
                    "fx": k[0, 0], "fy": k[1, 1], "cx": k[0, 2], "cy": k[1, 2],
                    "dist": list(d[:5]),
                    "file_fx": k_reflex[0, 0], "file_fy": k_reflex[1, 1],
                    "file_cx": k_reflex[0, 2], "file_cy": k_reflex[1, 2],
                    "file_dist": list(d_reflex[:5]),
                }
            )
        )
    elif mode == "hand-eye":
        report = json.load(open(sys.argv[4]))
        gripper = {v["image"]: v["gripper"] for v in report["views"] if v.get("gripper")}
        r_g2b, t_g2b, r_t2c, t_t2c = [], [], [], []
        for v, obj, pts in zip(views, objs, img):
            ok, rvec, tvec = cv2.solvePnP(obj, pts.astype(np.float64), k_reflex, d_reflex)
            assert ok, v["image"]
            g = gripper[v["image"]]
            r_g2b.append(rotation_from_xyzw(g["rotation_xyzw"]))
            t_g2b.append(np.array(g["translation_m"]).reshape(3, 1))
            r_t2c.append(cv2.Rodrigues(rvec)[0])
            t_t2c.append(tvec.reshape(3, 1))
        out = {"opencv": cv2.__version__, "views": len(img)}
        for name, method in [("park", cv2.CALIB_HAND_EYE_PARK), ("tsai", cv2.CALIB_HAND_EYE_TSAI)]:
            r, t = cv2.calibrateHandEye(r_g2b, t_g2b, r_t2c, t_t2c, method=method)
            out[name] = {"translation_m": list(t.reshape(-1)), "rotation_xyzw": quaternion_xyzw(r)}
        print(json.dumps(out))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
