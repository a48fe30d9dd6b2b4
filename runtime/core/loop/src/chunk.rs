//! Action chunks and how the loop executes them.
//!
//! A policy returns a chunk: `len` actions meant for the control ticks starting at the time of the
//! observation it was computed from (`t_start`), `dt` apart. The loop indexes the chunk by time,
//! so actions the policy took too long to produce are skipped rather than executed late. Two
//! execution modes, and a third way to run them:
//!
//! - newest wins: the newest chunk that covers the current time is executed;
//! - temporal ensembling (Zhao et al. 2023, ACT): every stored chunk that covers the current time
//!   contributes, weighted `exp(-m * i)` with `i = 0` for the oldest, normalised. ACT uses
//!   `m = 0.01`; a larger `m` gives newer predictions less weight: smoother, slower to react;
//! - wait (synchronous execution): the loop asks for the next chunk only when the executing one
//!   has run its `execute` actions, holds the robot while it is computed, and runs it from its
//!   first action at the tick it arrives (docs/runtime.md, "Chunk execution modes").

use std::time::Duration;

/// One chunk of actions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActionChunk {
    /// Time of the first action (the time of the observation it was computed from).
    pub t_start: Duration,
    /// Spacing of the actions.
    pub dt: Duration,
    /// Number of actions.
    pub len: usize,
    /// Action dimension.
    pub dim: usize,
    /// `len * dim` values, action-major.
    pub data: Vec<f32>,
    /// Running number assigned by the producer.
    pub seq: u64,
}

impl ActionChunk {
    /// An empty chunk with room for `len` actions of `dim` values.
    pub fn with_capacity(len: usize, dim: usize) -> Self {
        ActionChunk {
            t_start: Duration::ZERO,
            dt: Duration::ZERO,
            len: 0,
            dim,
            data: Vec::with_capacity(len * dim),
            seq: 0,
        }
    }

    /// Index of the action due at `t`, if the chunk covers `t`.
    pub fn index_at(&self, t: Duration) -> Option<usize> {
        if self.len == 0 || t < self.t_start || self.dt.is_zero() {
            return None;
        }
        let i = ((t - self.t_start).as_nanos() / self.dt.as_nanos()) as usize;
        (i < self.len).then_some(i)
    }

    /// Action `i`.
    pub fn action(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// Copies `src` in, reusing this chunk's buffer.
    pub fn copy_from(&mut self, src: &ActionChunk) {
        self.t_start = src.t_start;
        self.dt = src.dt;
        self.len = src.len;
        self.dim = src.dim;
        self.seq = src.seq;
        self.data.clear();
        self.data.extend_from_slice(&src.data);
    }
}

/// How overlapping chunks are combined.
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum ChunkMode {
    /// Execute the newest chunk covering the current time.
    NewestWins,
    /// Weighted average of every stored chunk covering the current time.
    Ensemble {
        /// Decay `m` of the weights `exp(-m i)`, `i = 0` for the oldest chunk.
        m: f32,
    },
    /// Synchronous execution: the robot holds while each chunk is computed, then executes its
    /// first `execute` actions from the tick it arrives (newest wins among what is held).
    Wait,
}

/// Whether the policy should be asked for its next chunk now, from the newest chunk's actions
/// still ahead (`remaining`, the one due now included; 0 when it does not cover the time or the
/// loop holds none) of its `len`: when it has run out, when `execute` of its actions are behind
/// it counted from its first (the execution horizon, as real-time chunking counts it: the
/// actions a slow policy's chunk spent in flight count too), or (the start threshold, for a
/// policy that answers later: `threshold = Some(delay)`) when no more actions are left than the
/// policy's delay in ticks plus `lead` (a thread's hand-over tick).
pub fn request_due(
    remaining: usize,
    len: usize,
    execute: usize,
    threshold: Option<usize>,
    lead: usize,
) -> bool {
    remaining == 0
        || len.saturating_sub(remaining) >= execute
        || threshold.is_some_and(|delay| remaining <= delay + lead)
}

/// The chunks the loop currently holds, in a ring of fixed capacity.
#[derive(Clone, Debug)]
pub struct ChunkQueue {
    ring: Vec<ActionChunk>,
    /// Ring positions in arrival order (oldest first), `len` of them valid.
    order: Vec<usize>,
    len: usize,
    mode: ChunkMode,
}

/// What [`ChunkQueue::action_at`] found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Blend {
    /// Chunks that contributed.
    pub chunks: usize,
    /// Age of the newest contributing chunk at the query time (time since its `t_start`).
    pub age: Duration,
    /// Sequence number of the newest contributing chunk.
    pub seq: u64,
}

impl ChunkQueue {
    /// Room for `capacity` chunks of up to `len` actions of `dim` values (allocated here, once).
    pub fn new(capacity: usize, len: usize, dim: usize, mode: ChunkMode) -> Self {
        assert!(capacity > 0);
        // Not `vec![x; n]`: cloning an empty Vec drops its capacity, and every slot must own
        // its full buffer before the loop starts (the zero-allocation test caught this).
        let ring = (0..capacity)
            .map(|_| ActionChunk::with_capacity(len, dim))
            .collect();
        ChunkQueue {
            ring,
            order: (0..capacity).collect(),
            len: 0,
            mode,
        }
    }

    /// Execution mode.
    pub fn mode(&self) -> ChunkMode {
        self.mode
    }

    /// Chunks held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when no chunk is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every chunk (e.g. when a person hands control back).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Adds a chunk, evicting the oldest when full.
    pub fn push(&mut self, c: &ActionChunk) {
        let cap = self.ring.len();
        if self.len == cap {
            self.order.rotate_left(1);
            self.len -= 1;
        }
        let slot = self.order[self.len];
        self.ring[slot].copy_from(c);
        self.len += 1;
    }

    /// Adds `c` as arriving at `t_start` with only its first `len` actions, the way a waiting
    /// robot runs a chunk (no allocation: the slot's buffer is reused).
    pub fn push_from(&mut self, c: &ActionChunk, t_start: Duration, len: usize) {
        self.push(c);
        let slot = &mut self.ring[self.order[self.len - 1]];
        slot.t_start = t_start;
        slot.len = slot.len.min(len);
    }

    /// Rows of the newest chunk still ahead at `t` (the one due at `t` included); 0 when it
    /// does not cover `t`. The chunk's age is rounded to the nearest tick, so a wall clock's
    /// jitter (a request tick that woke a little late, this one a little early) does not count
    /// a tick short.
    pub fn newest_remaining(&self, t: Duration) -> usize {
        if self.len == 0 {
            return 0;
        }
        let c = &self.ring[self.order[self.len - 1]];
        if c.dt.is_zero() || t + c.dt / 2 < c.t_start {
            return 0;
        }
        let i = ((t + c.dt / 2 - c.t_start).as_nanos() / c.dt.as_nanos()) as usize;
        c.len.saturating_sub(i)
    }

    /// Writes the actions the queue will execute at `t`, `t + dt`, ... into `out` (`dim` values
    /// per row, as many rows as fit), stopping at the first time no chunk covers; returns the
    /// rows written. What real-time chunking inpaints the next chunk toward.
    pub fn planned(&self, t: Duration, dt: Duration, dim: usize, out: &mut [f32]) -> usize {
        let rows = out.len() / dim.max(1);
        for (r, row) in out.chunks_exact_mut(dim).take(rows).enumerate() {
            if self.action_at(t + dt * r as u32, row).is_none() {
                return r;
            }
        }
        rows
    }

    /// Drops chunks that can no longer contribute at or after `t`.
    pub fn expire(&mut self, t: Duration) {
        let mut kept = 0;
        for k in 0..self.len {
            let slot = self.order[k];
            let c = &self.ring[slot];
            let end = c.t_start + c.dt * c.len as u32;
            if end > t {
                self.order.swap(kept, k);
                kept += 1;
            }
        }
        self.len = kept;
    }

    /// Writes the action due at `t` into `out`; `None` when no chunk covers `t`.
    pub fn action_at(&self, t: Duration, out: &mut [f32]) -> Option<Blend> {
        match self.mode {
            ChunkMode::NewestWins | ChunkMode::Wait => {
                for k in (0..self.len).rev() {
                    let c = &self.ring[self.order[k]];
                    if let Some(i) = c.index_at(t) {
                        out.copy_from_slice(c.action(i));
                        return Some(Blend {
                            chunks: 1,
                            age: t - c.t_start,
                            seq: c.seq,
                        });
                    }
                }
                None
            }
            ChunkMode::Ensemble { m } => {
                out.fill(0.0);
                let (mut wsum, mut n, mut newest) = (0.0f32, 0usize, None);
                for k in 0..self.len {
                    let c = &self.ring[self.order[k]];
                    if let Some(i) = c.index_at(t) {
                        let w = (-m * n as f32).exp();
                        for (o, a) in out.iter_mut().zip(c.action(i)) {
                            *o += w * a;
                        }
                        wsum += w;
                        n += 1;
                        newest = Some(c);
                    }
                }
                let c = newest?;
                for o in out.iter_mut() {
                    *o /= wsum;
                }
                Some(Blend {
                    chunks: n,
                    age: t - c.t_start,
                    seq: c.seq,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn chunk(t_ms: u32, values: &[f32], seq: u64) -> ActionChunk {
        ActionChunk {
            t_start: t_ms * MS,
            dt: 10 * MS,
            len: values.len(),
            dim: 1,
            data: values.to_vec(),
            seq,
        }
    }

    #[test]
    fn chunks_are_indexed_by_time() {
        let c = chunk(100, &[1.0, 2.0, 3.0], 0);
        assert_eq!(c.index_at(99 * MS), None);
        assert_eq!(c.index_at(100 * MS), Some(0));
        assert_eq!(c.index_at(119 * MS), Some(1));
        assert_eq!(c.index_at(129 * MS), Some(2));
        assert_eq!(c.index_at(130 * MS), None);
    }

    #[test]
    fn newest_chunk_wins_where_it_covers() {
        let mut q = ChunkQueue::new(4, 8, 1, ChunkMode::NewestWins);
        q.push(&chunk(0, &[1.0, 2.0, 3.0, 4.0], 1));
        q.push(&chunk(20, &[10.0, 20.0, 30.0, 40.0], 2));
        let mut out = [0.0];
        // Before the new chunk starts, the old one is used.
        assert_eq!(q.action_at(15 * MS, &mut out).unwrap().seq, 1);
        assert_eq!(out, [2.0]);
        let b = q.action_at(35 * MS, &mut out).unwrap();
        assert_eq!((out, b.seq, b.age), ([20.0], 2, 15 * MS));
        assert!(q.action_at(60 * MS, &mut out).is_none());
    }

    #[test]
    fn temporal_ensemble_matches_a_hand_computed_example() {
        // Three chunks cover t = 20 ms: A (from 0 ms) at index 2, B (from 10 ms) at index 1,
        // C (from 20 ms) at index 0. With m = 0.5 the weights are 1, e^-0.5, e^-1 (oldest first).
        let mut q = ChunkQueue::new(4, 8, 2, ChunkMode::Ensemble { m: 0.5 });
        let two = |t, v: &[f32], s| ActionChunk {
            t_start: t * MS,
            dt: 10 * MS,
            len: v.len() / 2,
            dim: 2,
            data: v.to_vec(),
            seq: s,
        };
        q.push(&two(0, &[0.0, 0.0, 0.0, 0.0, 1.0, -1.0, 9.0, 9.0], 1));
        q.push(&two(10, &[0.0, 0.0, 2.0, -2.0, 9.0, 9.0, 9.0, 9.0], 2));
        q.push(&two(20, &[4.0, -4.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0], 3));
        let mut out = [0.0; 2];
        let b = q.action_at(20 * MS, &mut out).unwrap();
        let (w0, w1, w2) = (1.0f32, (-0.5f32).exp(), (-1.0f32).exp());
        let expect = (1.0 * w0 + 2.0 * w1 + 4.0 * w2) / (w0 + w1 + w2);
        assert!((out[0] - expect).abs() < 1e-6, "{} vs {expect}", out[0]);
        assert!((out[1] + expect).abs() < 1e-6);
        assert_eq!((b.chunks, b.seq, b.age), (3, 3, Duration::ZERO));
        // Hand value: (1 + 2 * 0.60653 + 4 * 0.36788) / (1 + 0.60653 + 0.36788) = 1.86617
        assert!((out[0] - 1.86617).abs() < 1e-4, "{}", out[0]);
    }

    #[test]
    fn full_ring_evicts_the_oldest_and_expire_drops_finished_chunks() {
        let mut q = ChunkQueue::new(2, 4, 1, ChunkMode::NewestWins);
        q.push(&chunk(0, &[1.0; 4], 1));
        q.push(&chunk(10, &[2.0; 4], 2));
        q.push(&chunk(20, &[3.0; 4], 3));
        assert_eq!(q.len(), 2);
        let mut out = [0.0];
        // Chunk 1 was evicted: at 5 ms nothing covers.
        assert!(q.action_at(5 * MS, &mut out).is_none());
        q.expire(50 * MS);
        assert_eq!(q.len(), 1);
        q.expire(60 * MS);
        assert!(q.is_empty());
    }
}
