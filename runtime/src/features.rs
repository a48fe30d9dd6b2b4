//! The encoder beside the loop: a thread that turns the newest camera frames into feature maps
//! (a frozen image encoder, for a learner that sees) while the loop goes on.
//!
//! The loop offers each step's images ([`FeatureFeed::offer`]: copied into a triple buffer's slot,
//! reusing its buffers, then a non-blocking doorbell) and takes the newest maps there are
//! ([`FeatureFeed::latest`]); neither call waits, and neither allocates while the images keep the
//! sizes of the template the feed was started with.
//! The thread encodes only the newest frame: frames offered while it was busy are skipped and
//! counted, never queued. The maps carry the step of the frame they were made from, so their age
//! at use is known.

use crate::msg::Image;
use crate::triple::{Reader, Writer, triple};
use crossbeam::channel::{Receiver, Sender, TrySendError, bounded};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

/// Turns one step's images (every camera the encoder reads) into feature maps.
pub trait FrameEncoder: Send {
    /// Values written per step.
    fn features_len(&self) -> usize;
    /// Encodes `images` into `out` (`features_len` values); an error says what is wrong.
    fn encode(&mut self, images: &[Image], out: &mut [f32]) -> Result<(), String>;
}

/// One step's frames, as the loop offers them.
#[derive(Clone, Debug, Default)]
struct FrameSlot {
    step: u64,
    images: Vec<Image>,
}

/// The maps of one frame.
#[derive(Clone, Debug, Default)]
struct MapSlot {
    step: u64,
    values: Vec<f32>,
}

/// Counters of the feed (shared with the thread).
#[derive(Debug, Default)]
pub struct FeedStats {
    offered: AtomicU64,
    encoded: AtomicU64,
    errors: AtomicU64,
}

/// A snapshot of [`FeedStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FeedCounts {
    /// Frames the loop offered.
    pub offered: u64,
    /// Frames encoded.
    pub encoded: u64,
    /// Frames the encoder failed on (logged).
    pub errors: u64,
    /// Frames replaced by a newer one before the thread took them.
    pub skipped: u64,
}

impl FeedStats {
    /// The counters now.
    pub fn counts(&self) -> FeedCounts {
        let offered = self.offered.load(Ordering::Relaxed);
        let encoded = self.encoded.load(Ordering::Relaxed);
        let errors = self.errors.load(Ordering::Relaxed);
        FeedCounts {
            offered,
            encoded,
            errors,
            skipped: offered.saturating_sub(encoded + errors),
        }
    }
}

/// The loop's end of the encoder thread.
pub struct FeatureFeed {
    frames: Writer<FrameSlot>,
    maps: Reader<MapSlot>,
    bell: Option<Sender<()>>,
    stats: Arc<FeedStats>,
    thread: Option<JoinHandle<()>>,
    len: usize,
}

impl FeatureFeed {
    /// Starts the thread with `encoder`. `template`: one image per camera of the size the
    /// cameras deliver (its pixels do not matter); every buffer is sized from it up front.
    pub fn start(mut encoder: Box<dyn FrameEncoder>, template: &[Image]) -> std::io::Result<Self> {
        let len = encoder.features_len();
        let (frames, mut frames_rx) = triple(FrameSlot {
            step: 0,
            images: template.to_vec(),
        });
        let (mut maps_tx, maps) = triple(MapSlot {
            step: 0,
            values: vec![0.0; len],
        });
        let (bell, rings): (Sender<()>, Receiver<()>) = bounded(1);
        let stats = Arc::new(FeedStats::default());
        let st = stats.clone();
        let thread = std::thread::Builder::new()
            .name("reflex-encoder".into())
            .spawn(move || {
                while rings.recv().is_ok() {
                    if !frames_rx.update() {
                        continue;
                    }
                    let f = frames_rx.get();
                    let slot = maps_tx.slot();
                    match encoder.encode(&f.images, &mut slot.values) {
                        Ok(()) => {
                            slot.step = f.step;
                            maps_tx.publish();
                            st.encoded.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            let n = st.errors.fetch_add(1, Ordering::Relaxed);
                            if n.is_power_of_two() || n == 0 {
                                tracing::warn!("encoder: frame of step {}: {e}", f.step);
                            }
                        }
                    }
                }
            })?;
        Ok(FeatureFeed {
            frames,
            maps,
            bell: Some(bell),
            stats,
            thread: Some(thread),
            len,
        })
    }

    /// Values in one step's maps.
    pub fn features_len(&self) -> usize {
        self.len
    }

    /// Offers step `step`'s images (never blocks; reuses the slot's buffers).
    pub fn offer(&mut self, step: u64, images: &[Image]) {
        let slot = self.frames.slot();
        slot.step = step;
        slot.images.truncate(images.len());
        for (i, img) in images.iter().enumerate() {
            match slot.images.get_mut(i) {
                Some(dst) => dst.copy_from(img),
                None => slot.images.push(img.clone()),
            }
        }
        self.frames.publish();
        self.stats.offered.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = &self.bell {
            // Full: the thread has not yet taken the last ring, and will see this frame then.
            match b.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {}
            }
        }
    }

    /// The newest maps and the step of the frame they came from; `None` before the first.
    pub fn latest(&mut self) -> Option<(u64, &[f32])> {
        self.maps.update();
        let m = self.maps.get();
        (m.step != 0).then_some((m.step, &m.values[..]))
    }

    /// The counters.
    pub fn counts(&self) -> FeedCounts {
        self.stats.counts()
    }
}

impl Drop for FeatureFeed {
    fn drop(&mut self) {
        // Closing the doorbell ends the thread after the frame it is encoding.
        self.bell.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mean of each camera's red channel, and a count of calls: enough to see which frame
    /// was encoded.
    struct MeanRed;

    impl FrameEncoder for MeanRed {
        fn features_len(&self) -> usize {
            2
        }
        fn encode(&mut self, images: &[Image], out: &mut [f32]) -> Result<(), String> {
            if images.len() != 2 {
                return Err(format!("{} images, 2 expected", images.len()));
            }
            for (o, img) in out.iter_mut().zip(images) {
                let n = img.data.len() / 3;
                *o = img.data.iter().step_by(3).map(|v| *v as f32).sum::<f32>() / n as f32;
            }
            Ok(())
        }
    }

    fn image(camera: &str, red: u8) -> Image {
        Image {
            camera: camera.into(),
            width: 4,
            height: 2,
            encoding: "rgb8".into(),
            data: [red, 0, 0].repeat(8),
            seq: 0,
        }
    }

    fn wait_for(feed: &mut FeatureFeed, step: u64) -> Vec<f32> {
        let t0 = std::time::Instant::now();
        loop {
            if let Some((s, v)) = feed.latest()
                && s == step
            {
                return v.to_vec();
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(20),
                "no maps of step {step}"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_newest_frame_is_encoded_and_the_maps_name_its_step() {
        let mut feed =
            FeatureFeed::start(Box::new(MeanRed), &[image("front", 0), image("wrist", 0)]).unwrap();
        assert!(feed.latest().is_none());
        for step in 1..=50u64 {
            let r = step as u8;
            feed.offer(step, &[image("front", r), image("wrist", 2 * r)]);
        }
        assert_eq!(wait_for(&mut feed, 50), [50.0, 100.0]);
        let c = feed.counts();
        assert_eq!(c.offered, 50);
        assert_eq!(c.errors, 0);
        assert!((1..=50).contains(&c.encoded), "{c:?}");
        // A frame the encoder refuses is counted; the last good maps stay.
        feed.offer(51, &[image("front", 1)]);
        let t0 = std::time::Instant::now();
        while feed.counts().errors == 0 {
            assert!(t0.elapsed() < std::time::Duration::from_secs(20));
            std::thread::yield_now();
        }
        assert_eq!(feed.latest().map(|(s, _)| s), Some(50));
    }
}
