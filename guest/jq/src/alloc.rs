//! Small blocks by size class, in front of the system allocator (wasi-libc's
//! dlmalloc). jaq allocates and frees small blocks by the million (values,
//! `Rc`s, boxed iterators); a free list per size class makes each of those a
//! few instructions instead of a dlmalloc call. Blocks over [`MAX`] bytes, or
//! aligned to more than [`GRAIN`], go to dlmalloc as before.
//!
//! A freed small block goes back to its class's list and is reused by the
//! next allocation of that class; it is never returned to dlmalloc. The
//! module targets wasm32-wasip1, which has one thread.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr;
use std::alloc::System;

/// Size classes are multiples of this (and blocks aligned to it).
const GRAIN: usize = 16;
/// Largest block served from the classes.
const MAX: usize = 512;
const CLASSES: usize = MAX / GRAIN;
/// Bytes taken from dlmalloc at a time to carve small blocks from.
const CHUNK: usize = 64 << 10;

pub struct Classes {
    state: UnsafeCell<State>,
}

struct State {
    /// Head of each class's free list; a free block holds the next one.
    free: [*mut u8; CLASSES],
    /// The part of the current chunk not yet carved.
    next: *mut u8,
    end: *mut u8,
}

// SAFETY: wasm32-wasip1 runs one thread, so the state is never shared.
unsafe impl Sync for Classes {}

impl Classes {
    pub const fn new() -> Self {
        Self {
            state: UnsafeCell::new(State {
                free: [ptr::null_mut(); CLASSES],
                next: ptr::null_mut(),
                end: ptr::null_mut(),
            }),
        }
    }
}

/// The class of a small layout, or `None` for dlmalloc.
fn class(l: Layout) -> Option<usize> {
    (l.size() <= MAX && l.align() <= GRAIN).then(|| l.size().max(1).div_ceil(GRAIN) - 1)
}

unsafe impl GlobalAlloc for Classes {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let Some(c) = class(l) else {
            // SAFETY: forwarded as the caller gave it
            return unsafe { System.alloc(l) };
        };
        // SAFETY: one thread (see above), and no call below re-enters
        let s = unsafe { &mut *self.state.get() };
        let head = s.free[c];
        if !head.is_null() {
            // SAFETY: a free block of this class holds the next free block
            s.free[c] = unsafe { *head.cast::<*mut u8>() };
            return head;
        }
        let size = (c + 1) * GRAIN;
        if (s.end as usize) - (s.next as usize) < size {
            // the rest of the old chunk (under MAX bytes) is left unused
            // SAFETY: a valid, non-zero layout
            let chunk = unsafe { System.alloc(Layout::from_size_align_unchecked(CHUNK, GRAIN)) };
            if chunk.is_null() {
                return chunk;
            }
            s.next = chunk;
            // SAFETY: within the chunk just allocated
            s.end = unsafe { chunk.add(CHUNK) };
        }
        let p = s.next;
        // SAFETY: `size` bytes fit between `next` and `end`
        s.next = unsafe { p.add(size) };
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let Some(c) = class(l) else {
            // SAFETY: allocated by `System` with this layout
            return unsafe { System.dealloc(p, l) };
        };
        // SAFETY: one thread; `p` is a block of class `c`, at least GRAIN
        // bytes and aligned to it, no longer in use
        unsafe {
            let s = &mut *self.state.get();
            *p.cast::<*mut u8>() = s.free[c];
            s.free[c] = p;
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's layout rules carry over to the new size
        let new = unsafe { Layout::from_size_align_unchecked(new_size, l.align()) };
        match (class(l), class(new)) {
            (Some(a), Some(b)) if a == b => p,
            // SAFETY: allocated by `System` with `l`
            (None, None) => unsafe { System.realloc(p, l, new_size) },
            _ => {
                // SAFETY: a fresh block of the new layout, then a copy of
                // what both hold, then the old block freed
                unsafe {
                    let q = self.alloc(new);
                    if !q.is_null() {
                        ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
                        self.dealloc(p, l);
                    }
                    q
                }
            }
        }
    }
}
