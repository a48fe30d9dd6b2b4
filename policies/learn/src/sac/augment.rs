//! Random shifts of the feature maps in a batch: DrQ's image augmentation (Kostrikov et al.
//! 2020, "Image Augmentation Is All You Need"; SERL and HIL-SERL shift every camera image by up
//! to 4 pixels before their encoder) carried over to reflex's frozen encoder, whose maps travel
//! with the steps instead of the images.
//!
//! DrQ pads an image by replicating its edge and crops it back at a random offset. The encoder's
//! map is the image at a coarser grid (64x64 pixels to 16x16 places for the shipped one, four
//! pixels a place), so shifting a map by one place with its edge replicated is DrQ's four-pixel
//! shift at the encoder's stride. Each row's maps and its bootstrap row's maps get their own shift,
//! one per camera, as DrQ draws one per image.

use super::FeatureShape;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Shifts every camera's map in each of `rows` (`row_len` values each: `state_dim` state values,
/// then the maps in `maps` order, channel-major) by a random whole number of places in
/// `-max..=max` along each axis, with the edge replicated. The state is left as it is.
/// `scratch` holds one map while it is moved (grown once, then reused).
pub(crate) fn shift_maps(
    rows: &mut [f32],
    row_len: usize,
    state_dim: usize,
    maps: &[FeatureShape],
    max: usize,
    rng: &mut ChaCha8Rng,
    scratch: &mut Vec<f32>,
) {
    if max == 0 || row_len == 0 {
        return;
    }
    let max = max as i64;
    for row in rows.chunks_exact_mut(row_len) {
        let mut off = state_dim;
        for m in maps {
            let len = m.len();
            let dy = rng.random_range(-max..=max) as isize;
            let dx = rng.random_range(-max..=max) as isize;
            if dy != 0 || dx != 0 {
                shift_one(&mut row[off..off + len], m, dy, dx, scratch);
            }
            off += len;
        }
    }
}

/// `map[c][y][x] = old[c][clamp(y + dy)][clamp(x + dx)]`.
fn shift_one(map: &mut [f32], m: &FeatureShape, dy: isize, dx: isize, scratch: &mut Vec<f32>) {
    scratch.clear();
    scratch.extend_from_slice(map);
    let (h, w) = (m.height as isize, m.width as isize);
    let places = m.places();
    for c in 0..m.channels {
        let from = &scratch[c * places..(c + 1) * places];
        let to = &mut map[c * places..(c + 1) * places];
        for y in 0..h {
            let sy = (y + dy).clamp(0, h - 1);
            for x in 0..w {
                let sx = (x + dx).clamp(0, w - 1);
                to[(y * w + x) as usize] = from[(sy * w + sx) as usize];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn shape(camera: &str, channels: usize, height: usize, width: usize) -> FeatureShape {
        FeatureShape {
            camera: camera.into(),
            channels,
            height,
            width,
        }
    }

    /// The (dy, dx) in -1..=1 that turns `old` into `new` with the edge replicated, if any.
    fn which_shift(old: &[f32], new: &[f32], m: &FeatureShape) -> Option<(isize, isize)> {
        let mut s = Vec::new();
        for dy in -1..=1 {
            for dx in -1..=1 {
                let mut t = old.to_vec();
                shift_one(&mut t, m, dy, dx, &mut s);
                if t == new {
                    return Some((dy, dx));
                }
            }
        }
        None
    }

    #[test]
    fn one_place_to_the_right_replicates_the_left_edge() {
        // One channel, 2 x 3 places: a shift of dx = -1 shows what was one place to the left.
        let m = shape("front", 1, 2, 3);
        let mut map = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        shift_one(&mut map, &m, 0, -1, &mut Vec::new());
        assert_eq!(map, vec![1.0, 1.0, 2.0, 4.0, 4.0, 5.0]);
        let mut map = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        shift_one(&mut map, &m, 1, 1, &mut Vec::new());
        assert_eq!(map, vec![5.0, 6.0, 6.0, 5.0, 6.0, 6.0]);
    }

    #[test]
    fn every_map_moves_by_one_of_the_nine_shifts_and_the_state_never_moves() {
        let maps = [shape("front", 2, 4, 5), shape("wrist", 3, 3, 3)];
        let state_dim = 4;
        let row_len = state_dim + maps.iter().map(FeatureShape::len).sum::<usize>();
        let rows_n = 200;
        // Every value distinct, so a shift is recognisable.
        let old: Vec<f32> = (0..rows_n * row_len).map(|i| i as f32).collect();
        let mut new = old.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        shift_maps(
            &mut new,
            row_len,
            state_dim,
            &maps,
            1,
            &mut rng,
            &mut Vec::new(),
        );
        let mut seen = std::collections::BTreeSet::new();
        for r in 0..rows_n {
            let (o, n) = (&old[r * row_len..], &new[r * row_len..]);
            assert_eq!(o[..state_dim], n[..state_dim], "row {r}: the state moved");
            let mut off = state_dim;
            for m in &maps {
                let len = m.len();
                let s = which_shift(&o[off..off + len], &n[off..off + len], m)
                    .unwrap_or_else(|| panic!("row {r}, {}: not a shift of one place", m.camera));
                seen.insert((m.camera.clone(), s));
                off += len;
            }
        }
        // 200 rows draw all nine shifts for both cameras, the unshifted one included.
        assert_eq!(seen.len(), 18, "{seen:?}");
    }

    #[test]
    fn no_shift_leaves_the_rows_alone_and_the_draws_follow_the_seed() {
        let maps = [shape("front", 2, 4, 4)];
        let row_len = 3 + maps[0].len();
        let old: Vec<f32> = (0..10 * row_len).map(|i| (i as f32).sin()).collect();
        let mut same = old.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        shift_maps(&mut same, row_len, 3, &maps, 0, &mut rng, &mut Vec::new());
        assert_eq!(same, old);
        let run = |seed| {
            let mut v = old.clone();
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            shift_maps(&mut v, row_len, 3, &maps, 1, &mut rng, &mut Vec::new());
            v
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), old);
    }
}
