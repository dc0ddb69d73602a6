//! A lazily made value that one thread can check out and work with while
//! others wait for it to come back, rather than make a second one.
//!
//! A module's symbol state (its DWARF context: tens of milliseconds and
//! megabytes to build) lives in such a slot. The symbolization warm-up
//! thread checks it out, builds it or looks addresses up with no lock held,
//! and puts it back; a dump that needs the module meanwhile waits for it
//! instead of building a duplicate, which used to double the work whenever a
//! dump began while the warm-up was parsing libc.

use std::ops::Deref;
use std::sync::{Condvar, Mutex, MutexGuard};

/// The slot (see the module docs).
#[derive(Debug)]
pub(crate) struct CheckoutSlot<T> {
    inner: Mutex<Inner<T>>,
    returned: Condvar,
}

#[derive(Debug)]
struct Inner<T> {
    state: State<T>,
    /// Callers of [`CheckoutSlot::with`] waiting for a checked-out value.
    waiting: usize,
}

#[derive(Debug)]
enum State<T> {
    Empty,
    Ready(T),
    Out,
}

impl<T> Default for CheckoutSlot<T> {
    fn default() -> Self {
        CheckoutSlot {
            inner: Mutex::new(Inner {
                state: State::Empty,
                waiting: 0,
            }),
            returned: Condvar::new(),
        }
    }
}

impl<T> CheckoutSlot<T> {
    /// Runs `f` on the value, made by `make` (with the slot locked) if there
    /// is none; waits first while it is checked out.
    pub(crate) fn with<R>(&self, make: impl FnOnce() -> T, f: impl FnOnce(&T) -> R) -> R {
        let mut inner = self.lock();
        if matches!(inner.state, State::Out) {
            inner.waiting += 1;
            while matches!(inner.state, State::Out) {
                inner = self.returned.wait(inner).unwrap_or_else(|e| e.into_inner());
            }
            inner.waiting -= 1;
        }
        let value = match std::mem::replace(&mut inner.state, State::Empty) {
            State::Ready(value) => value,
            State::Empty | State::Out => make(),
        };
        let answer = f(&value);
        inner.state = State::Ready(value);
        answer
    }

    /// Takes the value out, or makes one with no lock held, until the
    /// returned guard is dropped; `None` if it is out already.
    pub(crate) fn check_out(&self, make: impl FnOnce() -> T) -> Option<Checkout<'_, T>> {
        let taken = {
            let mut inner = self.lock();
            match std::mem::replace(&mut inner.state, State::Out) {
                State::Out => return None,
                State::Ready(value) => Some(value),
                State::Empty => None,
            }
        };
        let mut guard = Checkout {
            slot: self,
            value: taken,
        };
        if guard.value.is_none() {
            // Should `make` unwind, the guard empties the slot again.
            guard.value = Some(make());
        }
        Some(guard)
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiting
    }
}

/// A checked-out value; dropping it puts it back and wakes the waiters.
pub(crate) struct Checkout<'a, T> {
    slot: &'a CheckoutSlot<T>,
    value: Option<T>,
}

impl<T> Deref for Checkout<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match &self.value {
            Some(value) => value,
            // `check_out` returns a guard only once the value is in it.
            None => unreachable!("a checkout always holds its value"),
        }
    }
}

impl<T> Drop for Checkout<'_, T> {
    fn drop(&mut self) {
        let mut inner = self.slot.lock();
        inner.state = match self.value.take() {
            Some(value) => State::Ready(value),
            None => State::Empty,
        };
        drop(inner);
        self.slot.returned.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits (up to a generous bound, so that a regression fails rather
    /// than hangs) until `n` callers wait on `slot`.
    fn until_waiting(slot: &CheckoutSlot<u32>, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while slot.waiting() < n {
            assert!(Instant::now() < deadline, "nobody waits for the checkout");
            std::thread::yield_now();
        }
    }

    /// A caller that needs the value while it is checked out waits for it
    /// and uses it: it is made once.
    #[test]
    fn a_checked_out_value_is_waited_for_not_made_again() {
        let slot = Arc::new(CheckoutSlot::default());
        let out = slot.check_out(|| 7).expect("the slot was empty");
        let waiter = {
            let slot = Arc::clone(&slot);
            std::thread::spawn(move || slot.with(|| 9, |v| *v))
        };
        until_waiting(&slot, 1);
        assert_eq!(*out, 7);
        drop(out);
        assert_eq!(waiter.join().expect("the waiter"), 7);
        assert_eq!(slot.with(|| 9, |v| *v), 7);
    }

    /// Only one checkout at a time; the value comes back for the next.
    #[test]
    fn one_checkout_at_a_time() {
        let slot = CheckoutSlot::default();
        let first = slot.check_out(|| 1).expect("the slot was empty");
        assert!(slot.check_out(|| 2).is_none());
        drop(first);
        let again = slot.check_out(|| 3).expect("the value came back");
        assert_eq!(*again, 1);
    }

    /// A maker that panics leaves the slot empty, not out for good: the
    /// next caller makes the value without waiting.
    #[test]
    fn a_failed_make_leaves_the_slot_empty() {
        let slot = CheckoutSlot::<u32>::default();
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            slot.check_out(|| panic!("parse failed")).map(|c| *c)
        }));
        assert!(failed.is_err());
        assert_eq!(slot.with(|| 5, |v| *v), 5);
    }
}
