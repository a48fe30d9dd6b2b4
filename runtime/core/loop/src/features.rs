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

/// An observation's identity (episode, step, sequence number, capture time): a new key is a new
/// frame.
pub type FrameKey = (u64, u32, u64, u64);

/// How the frozen encoder of a learner that sees runs beside the loop.
pub enum FeatureDriver {
    /// On its own thread ([`FeatureFeed`]), for real time: the loop uses the newest maps there
    /// are (made from an earlier frame than the one in hand) and counts maps older than
    /// `max_age_frames` frames as stale.
    Thread {
        /// The encoder thread.
        feed: FeatureFeed,
        /// Oldest maps the residual may read, in frames behind the newest.
        max_age_frames: u32,
    },
    /// On the loop's thread, once per new frame, for simulated time: the maps of the frame in
    /// hand, and a seed reproduces the run. (In simulated time nothing waits for the loop.)
    Inline(Box<dyn FrameEncoder>),
}

impl FeatureDriver {
    /// `encoder` on the loop's thread (`inline`, simulated time), or on its own thread with
    /// buffers sized from `template` (one image per camera) and maps up to `max_age_frames` old.
    pub fn start(
        encoder: Box<dyn FrameEncoder>,
        inline: bool,
        template: &[Image],
        max_age_frames: u32,
    ) -> std::io::Result<Self> {
        Ok(if inline {
            FeatureDriver::Inline(encoder)
        } else {
            FeatureDriver::Thread {
                feed: FeatureFeed::start(encoder, template)?,
                max_age_frames,
            }
        })
    }

    fn features_len(&self) -> usize {
        match self {
            FeatureDriver::Thread { feed, .. } => feed.features_len(),
            FeatureDriver::Inline(e) => e.features_len(),
        }
    }
}

/// Counters of the loop's use of feature maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FeatureCounts {
    /// Ticks whose maps were missing or too old (the residual gave nothing those ticks).
    pub stale: u64,
    /// Frames the inline encoder failed on.
    pub errors: u64,
    /// Frames behind the newest that the maps in use were made from.
    pub age_frames: u64,
}

/// Offer times of the last frames, to tell the age of the maps in use.
const OFFER_RING: usize = 16;

/// The loop's side of a learner that sees: a row of the state followed by the feature maps of
/// the same observation, kept up to date tick by tick without allocating.
pub struct LoopFeatures {
    driver: FeatureDriver,
    state_len: usize,
    /// State, then the maps the residual reads.
    row: Vec<f32>,
    /// Maps of the observation after a lockstep step.
    next: Vec<f32>,
    /// Frame the row's maps belong to (inline) or the last frame offered (thread).
    row_key: Option<FrameKey>,
    next_key: Option<FrameKey>,
    /// Frames offered to the thread, and the frame of the maps in the row.
    frames: u64,
    maps_frame: u64,
    offered_at: [std::time::Duration; OFFER_RING],
    fresh: bool,
    counts: FeatureCounts,
}

impl LoopFeatures {
    /// The loop's side for states of `state_len` values.
    pub fn new(driver: FeatureDriver, state_len: usize) -> Self {
        let n = driver.features_len();
        LoopFeatures {
            driver,
            state_len,
            row: vec![0.0; state_len + n],
            next: vec![0.0; n],
            row_key: None,
            next_key: None,
            frames: 0,
            maps_frame: 0,
            offered_at: [std::time::Duration::ZERO; OFFER_RING],
            fresh: false,
            counts: FeatureCounts::default(),
        }
    }

    /// Values of the maps.
    pub fn features_len(&self) -> usize {
        self.row.len() - self.state_len
    }

    /// Takes the observation the next action is chosen from: its state into the row, its frame
    /// to the encoder, and the maps the residual reads into the row (this frame's when inline,
    /// the newest there are from the thread). `t`: loop time.
    pub fn observe(
        &mut self,
        key: FrameKey,
        state: &[f32],
        images: &[Image],
        t: std::time::Duration,
    ) {
        self.row[..self.state_len].copy_from_slice(state);
        let s = self.state_len;
        match &mut self.driver {
            FeatureDriver::Inline(enc) => {
                if self.row_key != Some(key) {
                    if self.next_key == Some(key) {
                        // A lockstep step's next observation, encoded when the step closed.
                        self.row[s..].copy_from_slice(&self.next);
                        self.fresh = true;
                    } else {
                        self.fresh = enc.encode(images, &mut self.row[s..]).is_ok();
                        self.counts.errors += !self.fresh as u64;
                    }
                    self.row_key = self.fresh.then_some(key);
                }
            }
            FeatureDriver::Thread {
                feed,
                max_age_frames,
            } => {
                if self.row_key != Some(key) {
                    self.frames += 1;
                    self.offered_at[self.frames as usize % OFFER_RING] = t;
                    feed.offer(self.frames, images);
                    self.row_key = Some(key);
                }
                if let Some((frame, maps)) = feed.latest()
                    && frame != self.maps_frame
                {
                    self.row[s..].copy_from_slice(maps);
                    self.maps_frame = frame;
                }
                self.counts.age_frames = self.frames - self.maps_frame;
                self.fresh =
                    self.maps_frame != 0 && self.counts.age_frames <= *max_age_frames as u64;
            }
        }
        self.counts.stale += !self.fresh as u64;
    }

    /// Takes the observation after a lockstep step (a simulator answers every command at once):
    /// the maps of its frame (inline) or the newest there are (thread) become the step's next
    /// maps, [`LoopFeatures::next_maps`].
    pub fn after_lockstep(&mut self, key: FrameKey, images: &[Image], t: std::time::Duration) {
        match &mut self.driver {
            FeatureDriver::Inline(enc) => {
                let ok = enc.encode(images, &mut self.next).is_ok();
                self.counts.errors += !ok as u64;
                self.next_key = ok.then_some(key);
            }
            FeatureDriver::Thread { feed, .. } => {
                if self.row_key != Some(key) {
                    self.frames += 1;
                    self.offered_at[self.frames as usize % OFFER_RING] = t;
                    feed.offer(self.frames, images);
                    self.row_key = Some(key);
                }
                match feed.latest() {
                    Some((_, maps)) => self.next.copy_from_slice(maps),
                    None => self.next.copy_from_slice(&self.row[self.state_len..]),
                }
            }
        }
    }

    /// The state and maps the residual reads.
    pub fn row(&self) -> &[f32] {
        &self.row
    }

    /// The maps in the row.
    pub fn maps(&self) -> &[f32] {
        &self.row[self.state_len..]
    }

    /// The maps after a lockstep step.
    pub fn next_maps(&self) -> &[f32] {
        &self.next
    }

    /// Whether the row's maps may be used (made, and not older than allowed).
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// Age of the maps in use at loop time `now` (zero inline: they are of the frame in hand).
    pub fn age(&self, now: std::time::Duration) -> std::time::Duration {
        match self.driver {
            FeatureDriver::Inline(_) => std::time::Duration::ZERO,
            FeatureDriver::Thread { .. } if self.maps_frame == 0 => std::time::Duration::MAX,
            FeatureDriver::Thread { .. } => {
                if self.frames - self.maps_frame < OFFER_RING as u64 {
                    now.saturating_sub(self.offered_at[self.maps_frame as usize % OFFER_RING])
                } else {
                    std::time::Duration::MAX
                }
            }
        }
    }

    /// The counters, with the encoder thread's.
    pub fn counts(&self) -> (FeatureCounts, Option<FeedCounts>) {
        let feed = match &self.driver {
            FeatureDriver::Thread { feed, .. } => Some(feed.counts()),
            FeatureDriver::Inline(_) => None,
        };
        (self.counts, feed)
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
            age_ns: 0,
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
