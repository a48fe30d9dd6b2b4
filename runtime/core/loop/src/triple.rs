//! A wait-free triple buffer: one writer publishes values, one reader always gets the newest
//! complete one. Neither side ever blocks or allocates after construction, which is how the
//! control loop exchanges observations, action chunks, teleop commands and weights with the
//! threads beside it.
//!
//! With the `loom` feature the atomics and cells are loom's, and
//! `loom::every_interleaving_of_one_writer_and_one_reader_is_race_free_and_newest_first`
//! model-checks the protocol: every interleaving of a writer and a reader, loom's happens-before
//! tracking flagging any access to a slot that the index swaps do not order (`make test` runs
//! it: `cargo test -p reflex-runtime --features loom --lib triple`).

use sync::{Arc, AtomicU8, Ordering, UnsafeCell, slot_ptr};

/// The primitives, from std or (feature `loom`) from loom.
#[cfg(not(feature = "loom"))]
mod sync {
    pub use std::cell::UnsafeCell;
    pub use std::sync::Arc;
    pub use std::sync::atomic::{AtomicU8, Ordering};

    /// A pointer to the slot's value.
    pub fn slot_ptr<T>(c: &UnsafeCell<T>) -> *mut T {
        c.get()
    }
}

/// The primitives, from std or (feature `loom`) from loom.
#[cfg(feature = "loom")]
mod sync {
    pub use loom::cell::UnsafeCell;
    pub use loom::sync::Arc;
    pub use loom::sync::atomic::{AtomicU8, Ordering};

    /// A pointer to the slot's value; loom records a write access to the slot here, which it
    /// checks against every other access for a happens-before order.
    pub fn slot_ptr<T>(c: &UnsafeCell<T>) -> *mut T {
        c.with_mut(|p| p)
    }
}

const DIRTY: u8 = 0b100;
const INDEX: u8 = 0b011;

struct Shared<T> {
    slots: [UnsafeCell<T>; 3],
    /// Index of the slot in the middle (between writer and reader), plus a "new data" flag.
    middle: AtomicU8,
}

// SAFETY: each slot is accessed by at most one side at a time: the writer owns one index, the
// reader another, and the middle one is only touched through atomic swaps of the index. Values
// move between the two threads (T: Send). `T: Sync` too: a `Reader` shared between threads hands
// out `&T` to each of them at once (`Reader::get`), so it may only be shared when `T` may.
unsafe impl<T: Send + Sync> Sync for Shared<T> {}

/// The writing half.
pub struct Writer<T> {
    shared: Arc<Shared<T>>,
    index: u8,
}

/// The reading half.
pub struct Reader<T> {
    shared: Arc<Shared<T>>,
    index: u8,
}

// SAFETY: the halves only hand out access to the slot they own.
unsafe impl<T: Send> Send for Writer<T> {}
// SAFETY: as for the writer: the reader touches only the slot it owns.
unsafe impl<T: Send> Send for Reader<T> {}

/// A triple buffer whose three slots start as clones of `initial` (preallocate buffers here).
pub fn triple<T: Clone + Send>(initial: T) -> (Writer<T>, Reader<T>) {
    let shared = Arc::new(Shared {
        slots: [
            UnsafeCell::new(initial.clone()),
            UnsafeCell::new(initial.clone()),
            UnsafeCell::new(initial),
        ],
        middle: AtomicU8::new(1),
    });
    (
        Writer {
            shared: shared.clone(),
            index: 0,
        },
        Reader { shared, index: 2 },
    )
}

impl<T> Writer<T> {
    /// The writer's own slot, to fill in place before [`Writer::publish`].
    pub fn slot(&mut self) -> &mut T {
        // SAFETY: `index` is owned by the writer until it is swapped away in `publish`.
        unsafe { &mut *slot_ptr(&self.shared.slots[self.index as usize]) }
    }

    /// Makes the slot visible to the reader; the writer continues in another slot.
    pub fn publish(&mut self) {
        let prev = self
            .shared
            .middle
            .swap(self.index | DIRTY, Ordering::AcqRel);
        self.index = prev & INDEX;
    }

    /// Writes with `f` into the slot and publishes it.
    pub fn write(&mut self, f: impl FnOnce(&mut T)) {
        f(self.slot());
        self.publish();
    }
}

impl<T> Reader<T> {
    /// Takes the newest published value if there is one since the last call; returns whether the
    /// value returned by [`Reader::get`] changed.
    pub fn update(&mut self) -> bool {
        if self.shared.middle.load(Ordering::Acquire) & DIRTY == 0 {
            return false;
        }
        let prev = self.shared.middle.swap(self.index, Ordering::AcqRel);
        self.index = prev & INDEX;
        true
    }

    /// The value taken by the last successful [`Reader::update`].
    pub fn get(&self) -> &T {
        // SAFETY: `index` is owned by the reader until the next `update`.
        unsafe { &*slot_ptr(&self.shared.slots[self.index as usize]) }
    }

    /// Mutable access to the reader's current value (e.g. to take buffers out of it).
    pub fn get_mut(&mut self) -> &mut T {
        // SAFETY: as in `get`, and `&mut self` makes the access exclusive.
        unsafe { &mut *slot_ptr(&self.shared.slots[self.index as usize]) }
    }
}

#[cfg(all(test, feature = "loom"))]
mod loom {
    #[test]
    fn every_interleaving_of_one_writer_and_one_reader_is_race_free_and_newest_first() {
        loom::model(|| {
            let (mut w, mut r) = super::triple(0u64);
            let writer = loom::thread::spawn(move || {
                for i in 1..=3 {
                    w.write(|v| *v = i);
                }
            });
            let mut last = 0;
            for _ in 0..3 {
                if r.update() {
                    let v = *r.get();
                    assert!(v > last, "{v} after {last}");
                    last = v;
                }
            }
            writer.join().unwrap();
            r.update();
            assert_eq!(*r.get(), 3, "the last value published is the one read");
        });
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn reader_sees_newest_value_once() {
        let (mut w, mut r) = triple(0u64);
        assert!(!r.update());
        w.write(|v| *v = 1);
        w.write(|v| *v = 2);
        assert!(r.update());
        assert_eq!(*r.get(), 2);
        assert!(!r.update());
        assert_eq!(*r.get(), 2);
    }

    #[test]
    fn concurrent_reader_never_sees_a_torn_or_older_value() {
        // Each value is a vector whose entries all equal its sequence number.
        let (mut w, mut r) = triple(vec![0u64; 64]);
        let writer = std::thread::spawn(move || {
            for i in 1..=20_000u64 {
                w.write(|v| v.iter_mut().for_each(|x| *x = i));
            }
        });
        let mut last = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while last < 20_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "reader never saw the last value"
            );
            if r.update() {
                let v = r.get();
                assert!(v.iter().all(|x| *x == v[0]), "torn read");
                assert!(v[0] > last, "went backwards: {} after {last}", v[0]);
                last = v[0];
            }
        }
        writer.join().unwrap();
    }
}
