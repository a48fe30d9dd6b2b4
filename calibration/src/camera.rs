//! A camera's lens: the pinhole with OpenCV's five-coefficient distortion (Brown-Conrady: radial
//! k1, k2, k3 and tangential p1, p2), in OpenCV's conventions so that files go both ways: pixel
//! centres at integer coordinates, x right, y down, z forward.
//!
//! Files: OpenCV's `FileStorage` YAML as its calibration sample writes it (`camera_matrix` and
//! `distortion_coefficients` as `!!opencv-matrix`, `image_width`, `image_height`,
//! `avg_reprojection_error`), readable by `cv2.FileStorage`, and the same fields in JSON.

use nalgebra::{Matrix3, Point3, Vector2};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Intrinsics and distortion of one camera at one image size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CameraModel {
    /// Image width, px.
    pub width: u32,
    /// Image height, px.
    pub height: u32,
    /// Focal length along x, px.
    pub fx: f64,
    /// Focal length along y, px.
    pub fy: f64,
    /// Principal point, px (pixel centres at integers).
    pub cx: f64,
    /// Principal point, px.
    pub cy: f64,
    /// `[k1, k2, p1, p2, k3]`, OpenCV's order.
    pub dist: [f64; 5],
}

/// Why a camera file cannot be read or written; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CameraFileError {
    /// Reading or writing failed.
    #[error("camera calibration `{path}`: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Not a camera calibration reflex or OpenCV wrote.
    #[error("camera calibration `{path}`: {message}; write it with `reflex calibrate camera`")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl CameraModel {
    /// A pinhole without distortion.
    pub fn pinhole(width: u32, height: u32, fx: f64, fy: f64, cx: f64, cy: f64) -> Self {
        CameraModel {
            width,
            height,
            fx,
            fy,
            cx,
            cy,
            dist: [0.0; 5],
        }
    }

    /// The camera matrix `K`.
    pub fn k(&self) -> Matrix3<f64> {
        Matrix3::new(self.fx, 0.0, self.cx, 0.0, self.fy, self.cy, 0.0, 0.0, 1.0)
    }

    /// Distorts normalised image coordinates (`x/z`, `y/z`).
    pub fn distort(&self, x: f64, y: f64) -> Vector2<f64> {
        let [k1, k2, p1, p2, k3] = self.dist;
        let r2 = x * x + y * y;
        let radial = 1.0 + r2 * (k1 + r2 * (k2 + r2 * k3));
        Vector2::new(
            x * radial + 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x),
            y * radial + p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y,
        )
    }

    /// Pixel of a point in the camera frame; `None` behind the camera.
    pub fn project(&self, p: &Point3<f64>) -> Option<Vector2<f64>> {
        if p.z <= 1e-9 {
            return None;
        }
        let d = self.distort(p.x / p.z, p.y / p.z);
        Some(Vector2::new(
            self.fx * d.x + self.cx,
            self.fy * d.y + self.cy,
        ))
    }

    /// Normalised coordinates of a pixel with the distortion removed: Newton's method on the
    /// distortion (OpenCV's `undistortPoints` iterates a fixed point; Newton converges further
    /// out in strongly distorted corners).
    pub fn undistort(&self, u: f64, v: f64) -> Vector2<f64> {
        let target = Vector2::new((u - self.cx) / self.fx, (v - self.cy) / self.fy);
        if self.dist == [0.0; 5] {
            return target;
        }
        let mut p = target;
        for _ in 0..30 {
            let e = self.distort(p.x, p.y) - target;
            if e.norm() < 1e-14 {
                break;
            }
            // The distortion's Jacobian by central differences: cheap and exact enough here.
            let h = 1e-7;
            let dx = (self.distort(p.x + h, p.y) - self.distort(p.x - h, p.y)) / (2.0 * h);
            let dy = (self.distort(p.x, p.y + h) - self.distort(p.x, p.y - h)) / (2.0 * h);
            let j = nalgebra::Matrix2::from_columns(&[dx, dy]);
            match j.try_inverse() {
                Some(inv) => p -= inv * e,
                None => break,
            }
        }
        p
    }

    /// The model for the image resized by `scale` (a calibration at 640x480 used at 320x240).
    pub fn scaled(&self, width: u32, height: u32) -> CameraModel {
        let sx = width as f64 / self.width as f64;
        let sy = height as f64 / self.height as f64;
        CameraModel {
            width,
            height,
            fx: self.fx * sx,
            fy: self.fy * sy,
            // Pixel centres at integers: the image's edge sits at -0.5.
            cx: (self.cx + 0.5) * sx - 0.5,
            cy: (self.cy + 0.5) * sy - 0.5,
            dist: self.dist,
        }
    }

    /// OpenCV's `FileStorage` YAML, with the reprojection RMS when known.
    pub fn to_opencv_yaml(&self, rms_px: Option<f64>) -> String {
        let f = |v: f64| format!("{v:.17e}");
        let mut s = String::from("%YAML:1.0\n---\n");
        s += &format!(
            "image_width: {}\nimage_height: {}\n",
            self.width, self.height
        );
        s += &format!(
            "camera_matrix: !!opencv-matrix\n   rows: 3\n   cols: 3\n   dt: d\n   data: [ {}, 0., {}, 0.,\n       {}, {}, 0., 0., 1. ]\n",
            f(self.fx),
            f(self.cx),
            f(self.fy),
            f(self.cy)
        );
        s += &format!(
            "distortion_coefficients: !!opencv-matrix\n   rows: 1\n   cols: 5\n   dt: d\n   data: [ {} ]\n",
            self.dist.map(f).join(", ")
        );
        if let Some(rms) = rms_px {
            s += &format!("avg_reprojection_error: {}\n", f(rms));
        }
        s
    }

    /// Reads OpenCV's YAML layout (as [`Self::to_opencv_yaml`] and OpenCV's calibration sample
    /// write it).
    pub fn from_opencv_yaml(text: &str, path: &str) -> Result<CameraModel, CameraFileError> {
        let bad = |message: String| CameraFileError::Format {
            path: path.to_string(),
            message,
        };
        let scalar = |key: &str| -> Result<f64, CameraFileError> {
            let line = text
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
                .ok_or_else(|| bad(format!("no `{key}`")))?;
            line.trim()
                .parse()
                .map_err(|_| bad(format!("`{key}` is not a number: `{}`", line.trim())))
        };
        let matrix = |key: &str, n: usize| -> Result<Vec<f64>, CameraFileError> {
            let start = text
                .find(&format!("{key}:"))
                .ok_or_else(|| bad(format!("no `{key}`")))?;
            let rest = &text[start..];
            let open = rest
                .find("data:")
                .and_then(|d| rest[d..].find('[').map(|b| d + b + 1))
                .ok_or_else(|| bad(format!("`{key}` has no `data: [...]`")))?;
            let close = rest[open..]
                .find(']')
                .ok_or_else(|| bad(format!("`{key}`'s data has no closing `]`")))?;
            let values: Result<Vec<f64>, _> = rest[open..open + close]
                .split(',')
                .map(|v| v.trim().parse::<f64>())
                .collect();
            let values = values.map_err(|_| bad(format!("`{key}`'s data are not numbers")))?;
            if values.len() < n {
                return Err(bad(format!(
                    "`{key}` has {} values, expected {n}",
                    values.len()
                )));
            }
            Ok(values)
        };
        let k = matrix("camera_matrix", 9)?;
        let d = matrix("distortion_coefficients", 4)?;
        let mut dist = [0.0; 5];
        for (slot, v) in dist.iter_mut().zip(&d) {
            *slot = *v;
        }
        let model = CameraModel {
            width: scalar("image_width")? as u32,
            height: scalar("image_height")? as u32,
            fx: k[0],
            fy: k[4],
            cx: k[2],
            cy: k[5],
            dist,
        };
        model.check(path)?;
        Ok(model)
    }

    /// Reads a `.yaml`/`.yml` (OpenCV) or `.json` camera file.
    pub fn load(path: &Path) -> Result<CameraModel, CameraFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CameraFileError::Io {
            path: shown.clone(),
            source,
        })?;
        if path.extension().is_some_and(|e| e == "json") {
            let file: CameraFile =
                serde_json::from_str(&text).map_err(|e| CameraFileError::Format {
                    path: shown.clone(),
                    message: e.to_string(),
                })?;
            let model = file.model();
            model.check(&shown)?;
            Ok(model)
        } else {
            CameraModel::from_opencv_yaml(&text, &shown)
        }
    }

    fn check(&self, path: &str) -> Result<(), CameraFileError> {
        let ok = self.width > 0
            && self.height > 0
            && self.fx.is_finite()
            && self.fy.is_finite()
            && self.fx > 0.0
            && self.fy > 0.0
            && self.cx.is_finite()
            && self.cy.is_finite()
            && self.dist.iter().all(|d| d.is_finite());
        if ok {
            Ok(())
        } else {
            Err(CameraFileError::Format {
                path: path.to_string(),
                message: format!(
                    "not a camera: size {}x{}, fx {}, fy {}, cx {}, cy {}, distortion {:?}",
                    self.width, self.height, self.fx, self.fy, self.cx, self.cy, self.dist
                ),
            })
        }
    }
}

/// The JSON layout of a camera file: OpenCV's names.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CameraFile {
    /// Image width, px.
    pub image_width: u32,
    /// Image height, px.
    pub image_height: u32,
    /// `K`, row-major rows.
    pub camera_matrix: [[f64; 3]; 3],
    /// `[k1, k2, p1, p2, k3]`.
    pub distortion_coefficients: [f64; 5],
    /// Overall reprojection RMS, px.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_reprojection_error: Option<f64>,
}

impl CameraFile {
    /// The file for a model.
    pub fn new(m: &CameraModel, rms_px: Option<f64>) -> Self {
        CameraFile {
            image_width: m.width,
            image_height: m.height,
            camera_matrix: [[m.fx, 0.0, m.cx], [0.0, m.fy, m.cy], [0.0, 0.0, 1.0]],
            distortion_coefficients: m.dist,
            avg_reprojection_error: rms_px,
        }
    }

    /// The model it holds.
    pub fn model(&self) -> CameraModel {
        let k = &self.camera_matrix;
        CameraModel {
            width: self.image_width,
            height: self.image_height,
            fx: k[0][0],
            fy: k[1][1],
            cx: k[0][2],
            cy: k[1][2],
            dist: self.distortion_coefficients,
        }
    }
}

/// A per-pixel map from the undistorted (pinhole) image to the source image: what the capture
/// path applies to take the lens out of a camera's frames. Built once; applying it allocates
/// nothing.
#[derive(Clone, Debug)]
pub struct UndistortMap {
    width: u32,
    height: u32,
    /// Per output pixel: the source pixel's top-left neighbour index and bilinear weights, or
    /// `u32::MAX` where the source lies outside the image.
    taps: Vec<(u32, [u16; 4])>,
    src_width: u32,
}

impl UndistortMap {
    /// The map from `lens`'s images to pinhole images of `out` (same size and `K` unless the
    /// caller chooses another).
    pub fn new(lens: &CameraModel, out: &CameraModel) -> Self {
        let mut taps = Vec::with_capacity((out.width * out.height) as usize);
        for v in 0..out.height {
            for u in 0..out.width {
                let x = (u as f64 - out.cx) / out.fx;
                let y = (v as f64 - out.cy) / out.fy;
                let d = lens.distort(x, y);
                let su = lens.fx * d.x + lens.cx;
                let sv = lens.fy * d.y + lens.cy;
                let (u0, v0) = (su.floor(), sv.floor());
                if u0 < 0.0
                    || v0 < 0.0
                    || u0 + 1.0 >= lens.width as f64
                    || v0 + 1.0 >= lens.height as f64
                {
                    taps.push((u32::MAX, [0; 4]));
                    continue;
                }
                let (a, b) = (su - u0, sv - v0);
                let w = |x: f64| (x * 65535.0).round() as u16;
                taps.push((
                    v0 as u32 * lens.width + u0 as u32,
                    [
                        w((1.0 - a) * (1.0 - b)),
                        w(a * (1.0 - b)),
                        w((1.0 - a) * b),
                        w(a * b),
                    ],
                ));
            }
        }
        UndistortMap {
            width: out.width,
            height: out.height,
            taps,
            src_width: lens.width,
        }
    }

    /// Output size.
    pub fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// Undistorts an RGB8 image into `dst` (`width * height * 3` bytes); black where the
    /// source has no pixel.
    pub fn apply_rgb(&self, src: &[u8], dst: &mut [u8]) {
        let row = self.src_width as usize;
        for (o, &(i, w)) in dst.chunks_exact_mut(3).zip(&self.taps) {
            if i == u32::MAX {
                o.fill(0);
                continue;
            }
            let i = i as usize;
            let idx = [i, i + 1, i + row, i + row + 1];
            for (c, out) in o.iter_mut().enumerate() {
                let mut acc = 0u32;
                for (k, &wk) in w.iter().enumerate() {
                    acc += wk as u32 * src[idx[k] * 3 + c] as u32;
                }
                *out = ((acc + 32767) / 65535).min(255) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens() -> CameraModel {
        CameraModel {
            dist: [-0.21, 0.08, 0.0012, -0.0007, -0.015],
            ..CameraModel::pinhole(640, 480, 520.0, 518.0, 321.5, 239.0)
        }
    }

    #[test]
    fn undistort_inverts_distort_out_to_the_corners() {
        let m = lens();
        for &(u, v) in &[(0.0, 0.0), (639.0, 479.0), (320.0, 240.0), (12.0, 400.0)] {
            let n = m.undistort(u, v);
            let back = m.project(&Point3::new(n.x, n.y, 1.0)).unwrap();
            assert!(
                (back - Vector2::new(u, v)).norm() < 1e-8,
                "({u}, {v}) -> {back}"
            );
        }
    }

    #[test]
    fn yaml_and_json_files_round_trip_and_bad_files_name_the_key() {
        let m = lens();
        let yaml = m.to_opencv_yaml(Some(0.12));
        assert_eq!(CameraModel::from_opencv_yaml(&yaml, "x.yaml").unwrap(), m);
        let json = serde_json::to_string(&CameraFile::new(&m, None)).unwrap();
        let back: CameraFile = serde_json::from_str(&json).unwrap();
        assert_eq!(back.model(), m);
        let broken = yaml.replace("camera_matrix", "camera_matrx");
        let e = CameraModel::from_opencv_yaml(&broken, "front.yaml").unwrap_err();
        assert!(e.to_string().contains("front.yaml") && e.to_string().contains("camera_matrix"));
        let zero = yaml.replace("image_width: 640", "image_width: 0");
        assert!(CameraModel::from_opencv_yaml(&zero, "front.yaml").is_err());
    }

    #[test]
    fn the_undistort_map_puts_a_distorted_point_back_where_the_pinhole_sees_it() {
        let m = lens();
        let pin = CameraModel {
            dist: [0.0; 5],
            ..m
        };
        // A bright dot at a distorted location lands at the pinhole location.
        let p = Point3::new(0.3, -0.2, 1.0);
        let src_px = m.project(&p).unwrap();
        let dst_px = pin.project(&p).unwrap();
        let mut src = vec![0u8; 640 * 480 * 3];
        for dv in -2i32..=2 {
            for du in -2i32..=2 {
                let (u, v) = (
                    (src_px.x.round() as i32 + du) as usize,
                    (src_px.y.round() as i32 + dv) as usize,
                );
                src[(v * 640 + u) * 3..(v * 640 + u) * 3 + 3].fill(255);
            }
        }
        let map = UndistortMap::new(&m, &pin);
        let mut dst = vec![0u8; 640 * 480 * 3];
        map.apply_rgb(&src, &mut dst);
        let (mut su, mut sv, mut sw) = (0.0, 0.0, 0.0);
        for v in 0..480 {
            for u in 0..640 {
                let w = dst[(v * 640 + u) * 3] as f64;
                su += w * u as f64;
                sv += w * v as f64;
                sw += w;
            }
        }
        let centroid = Vector2::new(su / sw, sv / sw);
        assert!((centroid - dst_px).norm() < 1.0, "{centroid} vs {dst_px}");
    }
}
